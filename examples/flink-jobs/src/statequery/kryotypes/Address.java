package statequery.kryotypes;

/** A final nested value (its class is not written: the field type is final). */
public final class Address {
    private final String city;
    private final int zip;

    public Address(String city, int zip) {
        this.city = city;
        this.zip = zip;
    }
}
