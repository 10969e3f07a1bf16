package statequery.kryotypes;

import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The Kryo fixture's value class: it breaks Flink's POJO rules (no no-argument constructor, final
 * fields, an interface-typed field), so Flink serializes it with Kryo's FieldSerializer. Every
 * field is a function of the key index {@code k} (0..7) and the event count {@code n}.
 */
public class Order extends Entity {
    static final String[] NAMES = {
        "", "a", "plain ascii", "nul\u0000inside", "non-BMP \uD83D\uDE00 smile", "\u00fcn\u00efc\u00f6d\u00e9",
        "a long ascii string of more than thirty-two characters", "\u65e5\u672c"
    };

    /** A nested (static member) class that is not final: written with its class in a list. */
    public static class Line {
        final String sku;
        final int qty;

        Line(String sku, int qty) {
            this.sku = sku;
            this.qty = qty;
        }
    }

    private final String customer;
    private final String alias; // the same String instance as customer: a Kryo back-reference
    private final Integer quantity;
    private final Long total;
    private final Double ratio;
    private final Boolean paid;
    private final Character grade;
    private final Short shortBox;
    private final Byte byteBox;
    private final Float floatBox;
    private final int count;
    private final long millis;
    private final boolean flag;
    private final char letter;
    private final double price;
    private final float weight;
    private final short small;
    private final byte tiny;
    private final int[] scores;
    private final long[] stamps;
    private final byte[] payload;
    private final double[] readings;
    private final String[] tags;
    private final List<String> items;
    private final Map<String, Integer> counts;
    private final List<Line> lines;
    private final Color color;
    private final Shape shape;
    private final Address address;
    private final Instant created;
    private final LocalDate due;
    private final LocalDateTime seen;

    private Order(int k, int n) {
        super(k * 1000L + n);
        customer = NAMES[k];
        alias = customer;
        quantity = k % 3 == 0 ? null : k * n - 50;
        total = -(1L << 40) * k;
        ratio = k == 5 ? null : k / 4.0;
        paid = k % 2 == 0;
        grade = (char) ('A' + k);
        shortBox = (short) (-k * 300);
        byteBox = (byte) (k - 4);
        floatBox = 1.5f * k;
        count = n;
        millis = 1_700_000_000_000L + k;
        flag = k % 2 == 1;
        letter = k == 4 ? '\u00e9' : (char) ('a' + k);
        price = -k * 0.25;
        weight = k * 0.5f;
        small = (short) (k * 1000 - 4000);
        tiny = (byte) -k;
        scores = new int[k];
        for (int i = 0; i < k; i++) {
            scores[i] = i % 2 == 0 ? i * 1000 : -i;
        }
        stamps = k == 1 ? null : new long[] {k, -k, Long.MAX_VALUE, Long.MIN_VALUE};
        if (k == 2) {
            payload = null;
        } else {
            payload = new byte[k];
            for (int i = 0; i < k; i++) {
                payload[i] = (byte) (i * 77);
            }
        }
        readings = new double[] {k * 0.5, -0.0};
        tags = k == 6 ? null : new String[] {NAMES[k], null, "t" + k};
        items = new ArrayList<>();
        for (int i = 0; i < k % 4; i++) {
            items.add(k == 3 && i == 1 ? null : "item" + i);
        }
        if (k == 6) {
            counts = null;
        } else {
            counts = new HashMap<>();
            if (k != 7) {
                counts.put("a", k);
                counts.put("b", k == 1 ? null : n);
            }
        }
        lines = new ArrayList<>();
        if (k % 2 == 0) {
            lines.add(new Line("sku" + k, k));
            lines.add(new Line("sku" + k + "b", 2));
        }
        color = k == 7 ? null : Color.values()[k % 3];
        shape = k % 4 == 3 ? null : Shape.make(k, n);
        address = k == 5 ? null : new Address("city" + k, 10000 + k);
        created = k == 0 ? Instant.ofEpochSecond(-1, 5) : Instant.ofEpochSecond(1_700_000_000L + k * 86_400L, k * 1000);
        due = LocalDate.of(2024, 1 + k, 1 + k);
        seen = k == 3 ? null : LocalDateTime.of(2024, 2, 29, k, 30, 15, k * 1_000_000);
    }

    public static Order make(int k, int n) {
        return new Order(k, n);
    }

    public int count() {
        return count;
    }
}
