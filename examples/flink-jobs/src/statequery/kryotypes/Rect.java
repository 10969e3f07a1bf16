package statequery.kryotypes;

/** A final class with two final int fields (zigzag varints). */
public final class Rect implements Shape {
    private final int width;
    private final int height;

    public Rect(int width, int height) {
        this.width = width;
        this.height = height;
    }

    @Override
    public double area() {
        return (double) width * height;
    }
}
