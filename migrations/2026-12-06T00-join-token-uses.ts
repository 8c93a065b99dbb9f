import { type Kysely, sql } from 'kysely';

/**
 * A Join spends its token's use at commit, not in a statement before it: `join_token_uses`
 * records each use (which node joined with which token, when), and a deferred constraint trigger
 * raises the token's `uses` while the transaction commits, refusing (BC003) a token revoked,
 * expired or used up by then, which fails the commit. The token's row lock, which orders every
 * Join of one token, then lasts only through the commit itself: when a statement took it, it was
 * held across the round trip to COMMIT and whatever the gateway's event loop did in between, and
 * a herd of machines sharing one token joined one after the other at that pace (measured: the
 * spending statement waited 16.7 ms a Join at 42 joins a second; bench/README.md, 2026-12-06).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    CREATE TABLE join_token_uses (
      id bigserial PRIMARY KEY,
      token_id text NOT NULL REFERENCES join_tokens(id) ON DELETE CASCADE,
      node_id text NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
      used_at timestamptz NOT NULL DEFAULT compute_now()
    );
    CREATE INDEX join_token_uses_token_idx ON join_token_uses (token_id);
    CREATE INDEX join_token_uses_node_idx ON join_token_uses (node_id);

    CREATE FUNCTION spend_join_token_use() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      UPDATE join_tokens SET uses = uses + 1
      WHERE id = NEW.token_id AND revoked_at IS NULL AND expires_at > compute_now() AND uses < max_uses;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'join token % is revoked, expired or used up', NEW.token_id USING ERRCODE = 'BC003';
      END IF;
      RETURN NULL;
    END $$;
    CREATE CONSTRAINT TRIGGER join_token_uses_spend AFTER INSERT ON join_token_uses
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION spend_join_token_use();
  `.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`
    DROP TABLE join_token_uses;
    DROP FUNCTION spend_join_token_use();
  `.execute(db);
}
