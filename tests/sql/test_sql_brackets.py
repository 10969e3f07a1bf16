"""``x[i]`` in ``statequery sql`` means what it means in Spark SQL whatever ``x`` is: an array's
element counted from 0, a map's value for key ``i``, a struct's field (docs/sql.md, "Columns and
types"). sqlglot alone shifts an index only when it is an integer literal into what it does not
know is not an array: a map built in a subquery was looked up with key + 1, a column index into
an array of a subquery read the next element. The values asserted are Spark's for the same SQL
(with ``try_element_at``'s NULL past the ends): CASES and CATALOG_CASES were run by Spark 4.3
(ANSI off) over the same catalog through statequery's data source and gave them; that check is
not in CI (its Spark session costs more than the suite's budget). Over the shipped catalog."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import statequery
from statequery.catalog import Catalog
from statequery.exceptions import InvalidOptionError

#: one row (user-3's count), for queries that build their own values
COUNT = "user_activity.user_state__count"
ONE = f"{COUNT} WHERE key = 'user-3'"
LIST = "user_activity.user_state__recent_categories"
WHERE = "WHERE key = 'user-3'"


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return Catalog()


@pytest.fixture(scope="module")
def user3(cat: Catalog) -> list[str]:
    [row] = statequery.sql(f"SELECT value FROM {LIST} WHERE key = 'user-3'", cat).to_pylist()
    assert len(row["value"]) > 2 and len(set(row["value"][:2])) == 2  # a test that can fail
    return row["value"]


def _rows(query: str, cat: Catalog) -> list[dict]:
    return statequery.sql(query, cat).to_pylist()


#: (query, Spark's value of its one column ``v``), over one row
CASES: list[tuple[str, object]] = [
    # a map built in a subquery / a CTE: 1 is a key, not an index
    (f"SELECT m[1] AS v FROM (SELECT map(1, 2) AS m FROM {ONE})", 2),
    (f"WITH x AS (SELECT map(1, 2) AS m FROM {ONE}) SELECT m[1] AS v FROM x", 2),
    (f"SELECT m[k] AS v FROM (SELECT map('a', 1, 'b', 2) AS m, 'b' AS k FROM {ONE})", 2),
    (f"SELECT map_from_arrays(array(1, 2), array(3, 4))[1] AS v FROM {ONE}", 3),
    (f"SELECT m[0] AS v FROM (SELECT map(0, 'zero', 1, 'one') AS m FROM {ONE})", "zero"),
    # an index of a column, of arithmetic, into an array of a subquery
    (f"SELECT a[i] AS v FROM (SELECT array(10, 20) AS a, 0 AS i FROM {ONE})", 10),
    (f"SELECT a[i + 1] AS v FROM (SELECT array(10, 20) AS a, 0 AS i FROM {ONE})", 20),
    (f"SELECT a[i + 2] AS v FROM (SELECT array(10, 20) AS a, 0 AS i FROM {ONE})", None),
    # a negative index is NULL (past the front), never DuckDB's from-the-end
    (f"SELECT a[i - 1] AS v FROM (SELECT array(10, 20) AS a, 0 AS i FROM {ONE})", None),
    (f"SELECT a[i - 2] AS v FROM (SELECT array(10, 20) AS a, 0 AS i FROM {ONE})", None),
    (f"SELECT array(10, 20)[-1] AS v FROM {ONE}", None),
    (f"SELECT split(s, ',')[i + 1] AS v FROM (SELECT 'a,b,c' AS s, 0 AS i FROM {ONE})", "b"),
    (f"WITH x AS (SELECT array(10, 20) AS a, 1 AS i FROM {ONE}) SELECT a[i] AS v FROM x", 20),
    (f"SELECT v[1] AS v FROM (SELECT v FROM (SELECT array('p', 'q') AS v FROM {ONE}))", "q"),
    (f"SELECT collect_list(key)[0] AS v FROM {ONE}", "user-3"),
    ("SELECT sort_array(collect_list(k))[n] AS v FROM (SELECT key AS k, 1 AS n FROM "
     "user_activity.user_state__count WHERE key IN ('user-3', 'user-1')) GROUP BY n",
     "user-3"),
    (f"SELECT a[0][1] AS v FROM (SELECT array(array(1, 2)) AS a FROM {ONE})", 2),
    (f"SELECT concat(array(1), array(2))[n] AS v FROM (SELECT 1 AS n FROM {ONE})", 2),
    # LATERAL VIEW columns: what the exploded array's elements are
    (f"SELECT e[1] AS v FROM {COUNT} LATERAL VIEW explode(array(map(1, 'x'))) t AS e {WHERE}",
     "x"),
    (f"SELECT e[1] AS v FROM {COUNT} LATERAL VIEW OUTER explode(array(map(1, 'x'))) t AS e "
     f"{WHERE}", "x"),
    (f"SELECT e[1] AS v FROM {COUNT} LATERAL VIEW posexplode(array(array(1, 2))) t AS p, e "
     f"{WHERE}", 2),
    (f"SELECT a[0] AS v FROM {COUNT} LATERAL VIEW inline(array(struct(array(5, 6) AS a, "
     f"1 AS b))) t AS a, b {WHERE}", 5),
    (f"SELECT e[1] AS v FROM (SELECT explode(array(map(1, 'x'))) AS e FROM {ONE})", "x"),
    # a lambda's parameter is an element of the array (its index parameter counts from 0)
    (f"SELECT transform(array(array(1, 2), array(3, 4)), a -> a[1]) AS v FROM {ONE}", [2, 4]),
    (f"SELECT transform(array(map(1, 'x')), m -> m[1]) AS v FROM {ONE}", ["x"]),
    (f"SELECT transform(array(array(1, 2), array(3, 4)), (a, i) -> a[i]) AS v FROM {ONE}",
     [1, 4]),
    (f"SELECT filter(array(array(5, 6), array(7, 8)), (a, i) -> a[i] > 6) AS v FROM {ONE}",
     [[7, 8]]),
    (f"SELECT aggregate(array(array(1, 2), array(3, 4)), 0, (acc, a) -> acc + a[0]) AS v "
     f"FROM {ONE}", 4),
    (f"SELECT transform(array(10, 20), (x, i) -> x + i) AS v FROM {ONE}", [10, 21]),
    (f"SELECT filter(array(10, 20), (x, i) -> i > 0) AS v FROM {ONE}", [20]),
    (f"SELECT transform(array(array(1, 2)), (a, i) -> transform(a, (b, i) -> b * 10 + i)) "
     f"AS v FROM {ONE}", [[10, 21]]),
    # element_at counts from 1 for arrays (-1: the last) and takes a key for maps
    (f"SELECT element_at(array(10, 20), -1) AS v FROM {ONE}", 20),
    (f"SELECT element_at(m, 1) AS v FROM (SELECT map(1, 2) AS m FROM {ONE})", 2),
    # size of a map (DuckDB's array_length takes none); array_distinct keeps Spark's order
    (f"SELECT size(map('a', 1, 'b', 2)) AS v FROM {ONE}", 2),
    (f"SELECT size(m) AS v FROM (SELECT map('a', 1) AS m FROM {ONE})", 1),
    (f"SELECT array_distinct(array(3, 1, NULL, 3, 2, 1, NULL)) AS v FROM {ONE}",
     [3, 1, None, 2]),
    (f"SELECT array_distinct(split('b,a,b,c', ','))[1] AS v FROM {ONE}", "a"),
    # what the refusal of array_union says to write is Spark's array_union
    (f"SELECT array_distinct(concat(array(3, 1), array(1, 2))) AS v FROM {ONE}", [3, 1, 2]),
]


#: (query, Spark's value of ``v`` from user-3's list ``v``), over catalog lists
CATALOG_CASES: list[tuple[str, Callable[[list[str]], object]]] = [
    (f"SELECT q.v[q.i] AS v FROM (SELECT value AS v, 1 AS i FROM {LIST} {WHERE}) q",
     lambda v: v[1]),
    (f"WITH x AS (SELECT value AS v FROM {LIST} {WHERE}), y AS (SELECT v, 1 AS i FROM x) "
     f"SELECT v[i] AS v FROM y", lambda v: v[1]),
    (f"SELECT e[1] AS v FROM {LIST} LATERAL VIEW explode(array(value)) t AS e {WHERE}",
     lambda v: v[1]),
    (f"SELECT e[1] AS v FROM (SELECT explode(array(value)) AS e FROM {LIST} {WHERE})",
     lambda v: v[1]),
    (f"SELECT transform(value, x -> upper(x))[n] AS v FROM (SELECT value, 1 AS n FROM "
     f"{LIST} {WHERE})", lambda v: v[1].upper()),
    (f"SELECT filter(value, x -> x <> '')[n] AS v FROM (SELECT value, 1 AS n FROM "
     f"{LIST} {WHERE})", lambda v: v[1]),
    (f"SELECT a.value[b.value - b.value + 1] AS v FROM {LIST} a JOIN "
     f"user_activity.user_state__count b ON a.key = b.key WHERE a.key = 'user-3'",
     lambda v: v[1]),
    (f"SELECT w[i] AS v FROM (SELECT value AS w, 1 AS i FROM {LIST} {WHERE} UNION ALL "
     f"SELECT array('x') AS w, 5 AS i FROM {ONE}) WHERE w[i] IS NOT NULL", lambda v: v[1]),
    # a list field of an operator table's struct column (one row per state), via a subquery
    (f"SELECT q.rc.value[q.i] AS v FROM (SELECT recent_categories AS rc, 1 AS i FROM "
     f"user_activity.user_state {WHERE} AND recent_categories IS NOT NULL) q", lambda v: v[1]),
    (f"SELECT rc.value[size(rc.value) - 1] AS v FROM (SELECT recent_categories AS rc FROM "
     f"user_activity.user_state {WHERE} AND recent_categories IS NOT NULL)", lambda v: v[-1]),
    (f"SELECT concat(value, array('z'))[size(value)] AS v FROM {LIST} {WHERE}",
     lambda v: "z"),
    (f"SELECT array_distinct(value) AS v FROM {LIST} {WHERE}",
     lambda v: list(dict.fromkeys(v))),
]


@pytest.mark.parametrize(("query", "want"), CASES)
def test_an_index_means_what_it_means_in_spark(cat: Catalog, query: str, want: object) -> None:
    assert _rows(query, cat) == [{"v": want}]


def test_catalog_lists_through_subqueries_ctes_joins_and_unions(
    cat: Catalog, user3: list[str]
) -> None:
    for query, want in CATALOG_CASES:
        assert _rows(query, cat) == [{"v": want(user3)}], query


def test_every_row_of_a_subquery_reads_its_own_element(cat: Catalog) -> None:
    rows = _rows(f"SELECT w, g, w[g % 3] AS a, w[size(w) - 1] AS b FROM "
                 f"(SELECT value AS w, key_group AS g FROM {LIST})", cat)
    assert len(rows) == 20
    for r in rows:
        assert (r["a"], r["b"]) == (r["w"][r["g"] % 3], r["w"][-1]), r


@pytest.mark.parametrize("query", [
    f"SELECT x[0] FROM {LIST}, LATERAL (SELECT value AS x)",
    f"SELECT e[1] FROM (SELECT posexplode(array(map(1, 'x'))) AS (p, e) FROM {ONE})",
])
def test_an_index_into_what_cannot_be_told_is_refused(cat: Catalog, query: str) -> None:
    with pytest.raises(InvalidOptionError, match=r"cannot tell whether \w+ is an array .* "
                                                 r"element_at\(\w+, [12]\) for the element"):
        statequery.sql(query, cat)


def test_what_the_refusal_says_to_write_reads_the_element(cat: Catalog, user3: list[str]) -> None:
    lateral = f"FROM {LIST}, LATERAL (SELECT value AS x) WHERE key = 'user-3'"
    with pytest.raises(InvalidOptionError, match=r"element_at\(x, \(key_group % 2\) \+ 1\)"):
        statequery.sql(f"SELECT x[key_group % 2] {lateral}", cat)
    rows = _rows(f"SELECT key_group, element_at(x, (key_group % 2) + 1) AS a, "
                 f"CAST(x AS ARRAY<STRING>)[key_group % 2] AS b, element_at(x, -1) AS c "
                 f"{lateral}", cat)
    [r] = rows
    assert (r["a"], r["b"], r["c"]) == (user3[r["key_group"] % 2],) * 2 + (user3[-1],)
