package statequery.kryotypes;

/** An interface type: a field or state of this type is written with its concrete class. */
public interface Shape {
    double area();

    /** The shape of key index {@code k} after {@code n} events (deterministic). */
    static Shape make(int k, int n) {
        switch ((k + n) % 3) {
            case 0:
                return new Circle(k + n / 4.0);
            case 1:
                return new Rect(k, n);
            default:
                return new Rect(-k, n * 1000);
        }
    }
}
