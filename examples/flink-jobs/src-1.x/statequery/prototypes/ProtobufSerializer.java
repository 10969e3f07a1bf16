package statequery.prototypes;

import com.esotericsoftware.kryo.Kryo;
import com.esotericsoftware.kryo.Serializer;
import com.esotericsoftware.kryo.io.Input;
import com.esotericsoftware.kryo.io.Output;

/**
 * Flink 1.x (Kryo 2.24) form of {@code src/statequery/prototypes/ProtobufSerializer.java}:
 * chill-protobuf's wire form for {@link Reading}, the message's length
 * ({@code writeInt(length, true)}, a varint) then its bytes; Kryo 2.24's {@code read} takes a
 * {@code Class<Reading>}.
 */
public class ProtobufSerializer extends Serializer<Reading> {
    @Override
    public void write(Kryo kryo, Output output, Reading message) {
        byte[] ser = message.toByteArray();
        output.writeInt(ser.length, true);
        output.writeBytes(ser);
    }

    @Override
    public Reading read(Kryo kryo, Input input, Class<Reading> type) {
        int size = input.readInt(true);
        return Reading.parseFrom(input.readBytes(size));
    }

    @Override
    public Reading copy(Kryo kryo, Reading original) {
        return Reading.parseFrom(original.toByteArray());
    }
}
