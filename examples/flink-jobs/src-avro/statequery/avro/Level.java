package statequery.avro;

/** The Avro enum {@code statequery.avro.Level}, as Avro's compiler generates it. */
public enum Level {
    LOW, HIGH;

    public static final org.apache.avro.Schema SCHEMA$ = new org.apache.avro.Schema.Parser().parse(
            "{\"type\":\"enum\",\"name\":\"Level\",\"namespace\":\"statequery.avro\",\"symbols\":[\"LOW\",\"HIGH\"]}");

    public static org.apache.avro.Schema getClassSchema() {
        return SCHEMA$;
    }
}
