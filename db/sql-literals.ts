import { type RawBuilder, sql } from 'kysely';

/**
 * A closed set as a list of SQL literals (`'released', 'failed'`), for `IN (…)` in raw SQL: the
 * statement text stays the same as if it were written out, so partial indexes whose predicate
 * names the same set still match and prepared statements are not multiplied.
 */
export function literalList(values: readonly string[]): RawBuilder<unknown> {
  return sql.join(values.map((value) => sql.lit(value)));
}
