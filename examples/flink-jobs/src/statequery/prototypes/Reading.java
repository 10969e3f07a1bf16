package statequery.prototypes;

import java.util.Arrays;

/**
 * Stands in for the class protoc generates for {@code statequery.proto.Reading} (reading.proto:
 * java_package {@code statequery.prototypes}, java_multiple_files): it holds the message's bytes
 * (written by Python's protobuf; no Java protobuf runtime is at hand). Private final state and no
 * no-argument constructor, as a generated message: Flink serializes it with Kryo, here with
 * {@link ProtobufSerializer} registered for it.
 */
public final class Reading {
    private final byte[] bytes;

    private Reading(byte[] bytes) {
        this.bytes = bytes;
    }

    /** As a generated message's {@code parseFrom(byte[])}. */
    public static Reading parseFrom(byte[] bytes) {
        return new Reading(bytes.clone());
    }

    /** As a generated message's {@code toByteArray()}. */
    public byte[] toByteArray() {
        return bytes.clone();
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Reading && Arrays.equals(bytes, ((Reading) o).bytes);
    }

    @Override
    public int hashCode() {
        return Arrays.hashCode(bytes);
    }
}
