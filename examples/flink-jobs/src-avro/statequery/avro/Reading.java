package statequery.avro;

import org.apache.avro.Schema;
import org.apache.avro.specific.SpecificRecordBase;

import java.util.List;
import java.util.Map;

/**
 * The Avro record {@code statequery.avro.Reading} written the way Avro's compiler generates a
 * {@code SpecificRecord} (public fields, {@code SCHEMA$}, {@code get}/{@code put} by position), for
 * the Avro fixture job's {@code specific} state.
 */
public class Reading extends SpecificRecordBase {
    public static final Schema SCHEMA$ = new Schema.Parser().parse(
            "{\"type\":\"record\",\"name\":\"Reading\",\"namespace\":\"statequery.avro\",\"fields\":["
            + "{\"name\":\"sensor\",\"type\":\"string\"},"
            + "{\"name\":\"reading\",\"type\":\"double\"},"
            + "{\"name\":\"at\",\"type\":{\"type\":\"long\",\"logicalType\":\"timestamp-millis\"}},"
            + "{\"name\":\"level\",\"type\":{\"type\":\"enum\",\"name\":\"Level\",\"symbols\":[\"LOW\",\"HIGH\"]}},"
            + "{\"name\":\"samples\",\"type\":{\"type\":\"array\",\"items\":\"int\"}},"
            + "{\"name\":\"tags\",\"type\":{\"type\":\"map\",\"values\":\"string\"}},"
            + "{\"name\":\"remark\",\"type\":[\"null\",\"string\"],\"default\":null}]}");

    public static Schema getClassSchema() {
        return SCHEMA$;
    }

    public CharSequence sensor;
    public double reading;
    public long at;
    public Level level;
    public List<Integer> samples;
    public Map<CharSequence, CharSequence> tags;
    public CharSequence remark;

    public Reading() {}

    @Override
    public Schema getSchema() {
        return SCHEMA$;
    }

    @Override
    public Object get(int field) {
        switch (field) {
            case 0: return sensor;
            case 1: return reading;
            case 2: return at;
            case 3: return level;
            case 4: return samples;
            case 5: return tags;
            case 6: return remark;
            default: throw new IndexOutOfBoundsException("Invalid index: " + field);
        }
    }

    @Override
    @SuppressWarnings("unchecked")
    public void put(int field, Object value) {
        switch (field) {
            case 0: sensor = (CharSequence) value; break;
            case 1: reading = (Double) value; break;
            case 2: at = (Long) value; break;
            case 3: level = (Level) value; break;
            case 4: samples = (List<Integer>) value; break;
            case 5: tags = (Map<CharSequence, CharSequence>) value; break;
            case 6: remark = (CharSequence) value; break;
            default: throw new IndexOutOfBoundsException("Invalid index: " + field);
        }
    }
}
