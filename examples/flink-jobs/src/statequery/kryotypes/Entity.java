package statequery.kryotypes;

/** An abstract superclass: its fields are serialized with the subclass's, sorted by name. */
public abstract class Entity {
    static int created; // static: never serialized
    protected final long id;
    private transient int cached = 7; // transient: never serialized

    protected Entity(long id) {
        this.id = id;
        created++;
    }
}
