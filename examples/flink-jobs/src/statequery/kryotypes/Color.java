package statequery.kryotypes;

/** An enum field of {@link Order} (Kryo's EnumSerializer: ordinal + 1). */
public enum Color {
    RED,
    GREEN,
    BLUE
}
