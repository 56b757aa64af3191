-- idemproxy's durable store (claim/pgstore): the tables and the functions
-- every operation runs, each one statement and one round trip, judged on
-- the database's clock (idem_now) inside it. {{schema}} is the schema
-- (store.postgres.schema). Each function mirrors the Redis store's script
-- of the same name (claim/redisstore/scripts.go) on a record's bytes: byte
-- 1 the version, byte 2 the state (1 in progress, 2 completed, 3 a
-- stream), bytes 4..19 the owner token, bytes 68..69 a claim's status
-- slot, bytes 60..67 and 70 a stream's lease and end. A value of another
-- version is never overwritten or deleted. A row whose expires_ms has
-- passed is absent: every function treats it so at once; expiry only
-- reclaims its space later (idem_expire, by the index on expires_ms).
--
-- Versions (issue 62): every function is named for the schema version of
-- the release that installs it (idem_ below stands for idem_v{{version}}_,
-- Migrate's rewrite): two releases of a rolling upgrade each call their
-- own, side by side over the same tables, and a pod that installs its
-- release's functions never touches another release's (v0.7.0's, version
-- 1, are the unversioned idem_*). A release that changes a function's
-- body bumps the version. Tables change only by adding. Every function
-- runs with a fixed search_path and is not executable by PUBLIC: the
-- runtime role gets EXECUTE (store migrate -grant). The whole script is
-- one transaction, serialized by a lock on the versions table: a table of
-- idemproxy's own schema, which only its roles may lock (an advisory lock,
-- which any role that can connect may take, let another role stop every
-- migration: issue 78). Pods that start together on an empty database
-- race to create the schema; the loser's script fails on the created
-- objects and runs again (pgstore.Install), then waits on the lock.

CREATE SCHEMA IF NOT EXISTS {{schema}};
-- The schema versions installed: what store migrate reports.
CREATE TABLE IF NOT EXISTS {{schema}}.versions (
  version      int PRIMARY KEY,
  release      text NOT NULL,
  installed_at timestamptz NOT NULL DEFAULT now()
);
LOCK TABLE {{schema}}.versions IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE IF NOT EXISTS {{schema}}.records (
  key        text PRIMARY KEY,
  value      bytea NOT NULL,
  expires_ms bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS records_expires_ms ON {{schema}}.records (expires_ms);
-- The claims in progress (state byte 1), so that the oldest is found
-- without a scan (idem_cleanup).
CREATE INDEX IF NOT EXISTS records_in_progress ON {{schema}}.records (expires_ms) WHERE substring(value {{rec.state}}) = '\x01'::bytea;

-- A stream's chunks as rows of their own (store.record_format 5): an
-- append inserts one row instead of rewriting the whole value, so a
-- stream's WAL grows with its length, not its square. A stream's bytes
-- are its record's value, then its chunks in order: the chunks of the
-- stream whose token (value bytes 4..19) they carry, so that a later
-- record under the same key never reads an earlier stream's. They expire
-- with the record that wrote them.
CREATE TABLE IF NOT EXISTS {{schema}}.chunks (
  key        text NOT NULL,
  tok        bytea NOT NULL,
  at         bigint NOT NULL,
  data       bytea NOT NULL,
  expires_ms bigint NOT NULL,
  PRIMARY KEY (key, tok, at)
);
CREATE INDEX IF NOT EXISTS chunks_expires_ms ON {{schema}}.chunks (expires_ms);

-- The waiters (claim.Watch) of each key: one row per key and sidecar
-- with waiters of it, so that an operation on a key nobody waits for
-- sends no NOTIFY (notify.go). A row a sidecar never deleted (it died)
-- goes at until_ms.
CREATE TABLE IF NOT EXISTS {{schema}}.waiters (
  key      text NOT NULL,
  id       bytea NOT NULL,
  until_ms bigint NOT NULL,
  PRIMARY KEY (key, id)
);

CREATE TABLE IF NOT EXISTS {{schema}}.counters (
  key        text PRIMARY KEY,
  n          bigint NOT NULL,
  expires_ms bigint NOT NULL
);

CREATE TABLE IF NOT EXISTS {{schema}}.markers (
  name  text PRIMARY KEY,
  value text NOT NULL
);

-- The database's clock, Unix milliseconds.
CREATE OR REPLACE FUNCTION {{schema}}.idem_now() RETURNS bigint
LANGUAGE sql VOLATILE AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

-- A value's state byte; -1 for a value too short to have one.
CREATE OR REPLACE FUNCTION {{schema}}.idem_state(v bytea) RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT CASE WHEN length(v) >= {{rec.state.end}} THEN get_byte(v, {{rec.state.off}}) ELSE -1 END $$;

-- Whether v is a record of ours (version 1) owned by token tok.
CREATE OR REPLACE FUNCTION {{schema}}.idem_ours(v bytea, tok bytea) RETURNS bool
LANGUAGE sql IMMUTABLE AS $$ SELECT length(v) >= {{rec.token.end}} AND get_byte(v, {{rec.version.off}}) = 1 AND substring(v {{rec.token}}) = tok $$;

-- The live value under k, its row locked; NULL when there is none or it
-- expired (then its row, locked, is there to be overwritten).
CREATE OR REPLACE FUNCTION {{schema}}.idem_get(k text, now_ms bigint, OUT cur bytea, OUT exp bigint, OUT present bool)
LANGUAGE plpgsql AS $$
BEGIN
  SELECT r.value, r.expires_ms INTO cur, exp FROM {{schema}}.records r WHERE r.key = k FOR UPDATE;
  present := FOUND;
  IF present AND exp <= now_ms THEN
    cur := NULL;
  END IF;
END $$;

-- Writes v under k for ttl ms: over the row idem_get locked (present), or
-- as a new row. False when a row appeared meanwhile (another writer won).
CREATE OR REPLACE FUNCTION {{schema}}.idem_put(k text, v bytea, ttl bigint, now_ms bigint, present bool) RETURNS bool
LANGUAGE plpgsql AS $$
BEGIN
  IF present THEN
    UPDATE {{schema}}.records SET value = v, expires_ms = now_ms + ttl WHERE key = k;
    RETURN true;
  END IF;
  INSERT INTO {{schema}}.records (key, value, expires_ms) VALUES (k, v, now_ms + ttl) ON CONFLICT (key) DO NOTHING;
  RETURN FOUND;
END $$;

CREATE OR REPLACE FUNCTION {{schema}}.idem_del(k text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM {{schema}}.records WHERE key = k;
END $$;

-- A stream's length: where its last chunk row ends, or its value's
-- length when it has none (record_format 4, or nothing appended yet).
CREATE OR REPLACE FUNCTION {{schema}}.idem_len(k text, v bytea) RETURNS bigint
LANGUAGE sql STABLE AS $$
  SELECT COALESCE((SELECT c.at + length(c.data) FROM {{schema}}.chunks c
    WHERE c.key = k AND c.tok = substring(v {{rec.token}}) ORDER BY c.at DESC LIMIT 1), length(v))
$$;

-- A record's whole value: a stream's with its chunk rows; any other as
-- it is.
CREATE OR REPLACE FUNCTION {{schema}}.idem_whole(k text, v bytea) RETURNS bytea
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN v IS NULL OR {{schema}}.idem_state(v) <> 3 THEN v ELSE v || COALESCE((SELECT string_agg(c.data, ''::bytea ORDER BY c.at)
    FROM {{schema}}.chunks c WHERE c.key = k AND c.tok = substring(v {{rec.token}})), ''::bytea) END
$$;

-- Appends chunk to the stream whose row (cur, locked) holds k at its
-- length n: as a row of its own (rows, or when the stream has rows
-- already), or onto the value; with its lease set to lease_until either
-- way. Returns the new length.
CREATE OR REPLACE FUNCTION {{schema}}.idem_put_chunk(k text, cur bytea, n bigint, chunk bytea, rows bool, lease_until bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
  IF length(chunk) > 0 AND (rows OR n <> length(cur)) THEN
    INSERT INTO {{schema}}.chunks (key, tok, at, data, expires_ms)
      SELECT k, substring(cur {{rec.token}}), n, chunk, r.expires_ms FROM {{schema}}.records r WHERE r.key = k;
    UPDATE {{schema}}.records SET value = overlay(cur PLACING int8send(lease_until) {{rec.completed}}) WHERE key = k;
    RETURN n + length(chunk);
  END IF;
  UPDATE {{schema}}.records SET value = overlay(cur || chunk PLACING int8send(lease_until) {{rec.completed}}) WHERE key = k;
  RETURN n + length(chunk);
END $$;

-- The claim: k taken for v for ttl ms if absent, or the record there.
-- kind 1 claimed (pttl: ttl); 2 a settled record (cur); 3 a record in
-- progress (cur, pttl); 0 a stream longer than lim (len); 4 over the
-- quota (pttl: what is left of its window). With qkey, a new key counts
-- against qlimit per qwindow ms, undone beyond it.
CREATE OR REPLACE FUNCTION {{schema}}.idem_claim(k text, v bytea, ttl bigint, lim int, qkey text, qlimit bigint, qwindow bigint,
  OUT kind int, OUT cur bytea, OUT pttl bigint, OUT now_ms bigint, OUT len int)
LANGUAGE plpgsql AS $$
DECLARE
  exp bigint; present bool; qn bigint; qexp bigint; claimed bool := false;
BEGIN
  -- The two common cases, a new key and a settled record, are written out
  -- (idem_now, idem_state, idem_put): a helper with a fixed search_path is
  -- never inlined, and each call of one costs about as much as the row's
  -- read (see "The functions' hot paths" in docs/benchmarks.md).
  now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  -- A settled record (a replay) is read without a lock: it changes only
  -- by expiring or by the key API's delete, and a replay needs neither
  -- the insert's attempt nor the row lock.
  SELECT r.value, r.expires_ms INTO cur, exp FROM {{schema}}.records r WHERE r.key = k;
  IF NOT FOUND THEN
    INSERT INTO {{schema}}.records (key, value, expires_ms) VALUES (k, v, now_ms + ttl) ON CONFLICT (key) DO NOTHING;
    claimed := FOUND;
  ELSIF exp > now_ms AND length(cur) >= {{rec.state.end}} AND get_byte(cur, {{rec.state.off}}) = 2 THEN
    kind := 2;
    RETURN;
  ELSIF exp > now_ms AND {{schema}}.idem_state(cur) = 3 AND NOT (lim > 0 AND {{schema}}.idem_len(k, cur) > lim) THEN
    kind := 2; cur := {{schema}}.idem_whole(k, cur);
    RETURN;
  END IF;
  cur := NULL;
  WHILE NOT claimed LOOP
    SELECT g.cur, g.exp, g.present INTO cur, exp, present FROM {{schema}}.idem_get(k, now_ms) g;
    EXIT WHEN cur IS NOT NULL;
    claimed := {{schema}}.idem_put(k, v, ttl, now_ms, present);
  END LOOP;
  IF claimed THEN
    kind := 1; pttl := ttl; cur := NULL;
    IF qkey IS NOT NULL AND qlimit > 0 THEN
      INSERT INTO {{schema}}.counters AS c (key, n, expires_ms) VALUES (qkey, 1, now_ms + qwindow)
      ON CONFLICT (key) DO UPDATE SET
        n = CASE WHEN c.expires_ms <= now_ms THEN 1 ELSE c.n + 1 END,
        expires_ms = CASE WHEN c.expires_ms <= now_ms THEN now_ms + qwindow ELSE c.expires_ms END
      RETURNING c.n, c.expires_ms INTO qn, qexp;
      IF qn > qlimit THEN
        DELETE FROM {{schema}}.records WHERE key = k;
        UPDATE {{schema}}.counters AS c SET n = c.n - 1 WHERE c.key = qkey;
        kind := 4; pttl := qexp - now_ms;
      END IF;
    END IF;
    RETURN;
  END IF;
  IF {{schema}}.idem_state(cur) <> 1 THEN
    IF lim > 0 AND {{schema}}.idem_state(cur) = 3 THEN
      len := {{schema}}.idem_len(k, cur);
      IF len > lim THEN
        kind := 0; cur := NULL;
        RETURN;
      END IF;
      len := NULL;
    END IF;
    kind := 2; cur := {{schema}}.idem_whole(k, cur);
    RETURN;
  END IF;
  kind := 3; pttl := exp - now_ms;
END $$;

-- What is left of k's lease, and the database's clock.
CREATE OR REPLACE FUNCTION {{schema}}.idem_ttl(k text, OUT pttl bigint, OUT now_ms bigint)
LANGUAGE plpgsql AS $$
BEGIN
  now_ms := {{schema}}.idem_now();
  SELECT r.expires_ms - now_ms INTO pttl FROM {{schema}}.records r WHERE r.key = k AND r.expires_ms > now_ms;
  IF NOT FOUND THEN pttl := -2; END IF;
END $$;

-- A record and what is left of its key's lease (-2: absent).
CREATE OR REPLACE FUNCTION {{schema}}.idem_read(k text, OUT cur bytea, OUT pttl bigint)
LANGUAGE plpgsql AS $$
DECLARE now_ms bigint := {{schema}}.idem_now();
BEGIN
  SELECT {{schema}}.idem_whole(k, r.value), r.expires_ms - now_ms INTO cur, pttl FROM {{schema}}.records r WHERE r.key = k AND r.expires_ms > now_ms;
  IF NOT FOUND THEN pttl := -2; END IF;
END $$;

-- 1 renewed, 0 gone, -1 another owner's, -2 already completed. A claim
-- marked as claimed (the top bits of byte 68 are 01) is rewritten as
-- renewed (10).
CREATE OR REPLACE FUNCTION {{schema}}.idem_renew(k text, tok bytea, ttl bigint) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE now_ms bigint := {{schema}}.idem_now(); cur bytea; m int;
BEGIN
  SELECT g.cur INTO cur FROM {{schema}}.idem_get(k, now_ms) g;
  IF cur IS NULL THEN RETURN 0; END IF;
  IF NOT {{schema}}.idem_ours(cur, tok) THEN RETURN -1; END IF;
  IF {{schema}}.idem_state(cur) <> 1 THEN RETURN -2; END IF;
  IF length(cur) >= {{rec.mark.end}} THEN
    m := get_byte(cur, {{rec.mark.off}});
    IF m >= 64 AND m < 128 THEN cur := set_byte(cur, {{rec.mark.off}}, m + 64); END IF;
  END IF;
  UPDATE {{schema}}.records SET value = cur, expires_ms = now_ms + ttl WHERE key = k;
  RETURN 1;
END $$;

-- 1 released, 0 gone, -1 changed (fenced on token, state and slot).
CREATE OR REPLACE FUNCTION {{schema}}.idem_release_unforwarded(k text, tok bytea, slot bytea) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE cur bytea;
BEGIN
  SELECT g.cur INTO cur FROM {{schema}}.idem_get(k, {{schema}}.idem_now()) g;
  IF cur IS NULL THEN RETURN 0; END IF;
  IF NOT {{schema}}.idem_ours(cur, tok) OR {{schema}}.idem_state(cur) <> 1 OR length(cur) < {{rec.status.end}} OR substring(cur {{rec.status}}) <> slot THEN RETURN -1; END IF;
  PERFORM {{schema}}.idem_del(k);
  RETURN 1;
END $$;

-- 1 stored, 2 stored after the lease lapsed, 3 already stored by us, -1
-- another owner's.
CREATE OR REPLACE FUNCTION {{schema}}.idem_complete(k text, tok bytea, v bytea, ttl bigint) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE now_ms bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint; cur bytea; present bool;
BEGIN
  -- The common case, our live claim, is one fenced update, written out
  -- as idem_claim's are.
  UPDATE {{schema}}.records r SET value = v, expires_ms = now_ms + ttl
    WHERE r.key = k AND r.expires_ms > now_ms AND length(r.value) >= {{rec.token.end}} AND get_byte(r.value, {{rec.version.off}}) = 1
      AND substring(r.value {{rec.token}}) = tok AND get_byte(r.value, {{rec.state.off}}) = 1;
  IF FOUND THEN RETURN 1; END IF;
  SELECT g.cur, g.present INTO cur, present FROM {{schema}}.idem_get(k, now_ms) g;
  IF cur IS NULL THEN
    IF NOT {{schema}}.idem_put(k, v, ttl, now_ms, present) THEN RETURN -1; END IF;
    RETURN 2;
  END IF;
  IF NOT {{schema}}.idem_ours(cur, tok) THEN RETURN -1; END IF;
  IF {{schema}}.idem_state(cur) = 2 THEN RETURN 3; END IF;
  PERFORM {{schema}}.idem_put(k, v, ttl, now_ms, true);
  RETURN 1;
END $$;

-- 1 released, 0 gone, -1 another owner's, -2 completed.
CREATE OR REPLACE FUNCTION {{schema}}.idem_release(k text, tok bytea) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE now_ms bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint; cur bytea;
BEGIN
  -- Our live claim: one fenced delete, written out as idem_complete's.
  DELETE FROM {{schema}}.records r
    WHERE r.key = k AND r.expires_ms > now_ms AND length(r.value) >= {{rec.token.end}} AND get_byte(r.value, {{rec.version.off}}) = 1
      AND substring(r.value {{rec.token}}) = tok AND get_byte(r.value, {{rec.state.off}}) = 1;
  IF FOUND THEN RETURN 1; END IF;
  SELECT g.cur INTO cur FROM {{schema}}.idem_get(k, now_ms) g;
  IF cur IS NULL THEN RETURN 0; END IF;
  IF NOT {{schema}}.idem_ours(cur, tok) THEN RETURN -1; END IF;
  IF {{schema}}.idem_state(cur) <> 1 THEN RETURN -2; END IF;
  PERFORM {{schema}}.idem_del(k);
  RETURN 1;
END $$;

-- Settles an orphan: 1 settled, 0 gone, -1 another owner's, -2
-- completed, -3 its owner renewed (its lease is more than its tail, or
-- its expiry moved past slack ms of exp, when exp > 0).
CREATE OR REPLACE FUNCTION {{schema}}.idem_orphan(k text, tok bytea, v bytea, ttl bigint, tail bigint, exp_seen bigint, slack bigint) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE now_ms bigint := {{schema}}.idem_now(); cur bytea; exp bigint;
BEGIN
  SELECT g.cur, g.exp INTO cur, exp FROM {{schema}}.idem_get(k, now_ms) g;
  IF cur IS NULL THEN RETURN 0; END IF;
  IF NOT {{schema}}.idem_ours(cur, tok) THEN RETURN -1; END IF;
  IF {{schema}}.idem_state(cur) <> 1 THEN RETURN -2; END IF;
  IF exp - now_ms > tail THEN RETURN -3; END IF;
  IF exp_seen > 0 AND abs(exp - exp_seen) > slack THEN RETURN -3; END IF;
  PERFORM {{schema}}.idem_put(k, v, ttl, now_ms, true);
  RETURN 1;
END $$;

-- Takes over a record whose outcome is unknown: res 1 taken (since,
-- now_ms), 0 gone, -1 changed, -3 the orphan's owner renewed.
CREATE OR REPLACE FUNCTION {{schema}}.idem_take_over(k text, tok bytea, v bytea, ttl bigint, tail bigint, since_in bigint, exp_seen bigint, slack bigint,
  OUT res int, OUT since bigint, OUT now_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE cur bytea; exp bigint; st int;
BEGIN
  now_ms := {{schema}}.idem_now();
  SELECT g.cur, g.exp INTO cur, exp FROM {{schema}}.idem_get(k, now_ms) g;
  IF cur IS NULL THEN res := 0; RETURN; END IF;
  st := {{schema}}.idem_state(cur);
  IF NOT {{schema}}.idem_ours(cur, tok) OR (st <> 1 AND st <> 2) THEN res := -1; RETURN; END IF;
  IF st = 1 THEN
    IF exp - now_ms > tail THEN res := -3; RETURN; END IF;
    IF exp_seen > 0 AND abs(exp - exp_seen) > slack THEN res := -3; RETURN; END IF;
    since := now_ms - (tail - (exp - now_ms));
  ELSE
    since := since_in;
    IF since <= 0 OR since > now_ms THEN since := now_ms; END IF;
  END IF;
  PERFORM {{schema}}.idem_put(k, v, ttl, now_ms, true);
  res := 1;
END $$;

-- Frees a key taken over after an absent answer: res 1 freed, 0 gone, -1
-- changed, -4 too early (n: ms left), -6 the clocks disagree (n: the
-- offset ms).
CREATE OR REPLACE FUNCTION {{schema}}.idem_free_absent(k text, tok bytea, since bigint, age bigint, caller_ms bigint, max_offset bigint, OUT res int, OUT n bigint)
LANGUAGE plpgsql AS $$
DECLARE now_ms bigint := {{schema}}.idem_now(); cur bytea;
BEGIN
  SELECT g.cur INTO cur FROM {{schema}}.idem_get(k, now_ms) g;
  IF cur IS NULL THEN res := 0; RETURN; END IF;
  IF NOT {{schema}}.idem_ours(cur, tok) OR {{schema}}.idem_state(cur) <> 1 THEN res := -1; RETURN; END IF;
  IF abs(now_ms - caller_ms) > max_offset THEN res := -6; n := now_ms - caller_ms; RETURN; END IF;
  IF since + age - now_ms > 0 THEN res := -4; n := since + age - now_ms; RETURN; END IF;
  PERFORM {{schema}}.idem_del(k);
  res := 1;
END $$;

-- 1 deleted, 0 gone, -1 in another state or not a record of ours.
CREATE OR REPLACE FUNCTION {{schema}}.idem_forget(k text, st int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE cur bytea;
BEGIN
  SELECT g.cur INTO cur FROM {{schema}}.idem_get(k, {{schema}}.idem_now()) g;
  IF cur IS NULL THEN RETURN 0; END IF;
  IF length(cur) < {{rec.state.end}} OR get_byte(cur, {{rec.version.off}}) <> 1 OR get_byte(cur, {{rec.state.off}}) <> st THEN RETURN -1; END IF;
  PERFORM {{schema}}.idem_del(k);
  DELETE FROM {{schema}}.chunks WHERE key = k;
  RETURN 1;
END $$;

-- Streams. A stream's value is its head then its chunks; its lease (a
-- running stream's: from now on the database's clock) is in bytes 60..67,
-- its end in byte 70.

-- 1 started, 2 started after the lease lapsed, 3 already started by us,
-- -1 another owner's, -2 completed. rows (record_format 5): the head's
-- last byte goes in a chunk row, so that a release that reads the value
-- alone (v0.7.0, which knows no chunk rows) finds a head longer than the
-- value and refuses the record as unreadable instead of replaying the
-- stream short; every reader here reads value and rows together.
CREATE OR REPLACE FUNCTION {{schema}}.idem_stream_start(k text, tok bytea, head bytea, ttl bigint, lease bigint, rows bool) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE now_ms bigint := {{schema}}.idem_now(); cur bytea; present bool; how int := 1; v bytea; own bytea := tok;
BEGIN
  SELECT g.cur, g.present INTO cur, present FROM {{schema}}.idem_get(k, now_ms) g;
  IF cur IS NULL THEN
    how := 2;
  ELSE
    IF NOT {{schema}}.idem_ours(cur, tok) THEN RETURN -1; END IF;
    IF {{schema}}.idem_state(cur) = 3 THEN RETURN 3; END IF;
    IF {{schema}}.idem_state(cur) <> 1 THEN RETURN -2; END IF;
  END IF;
  v := overlay(head PLACING int8send(now_ms + lease) {{rec.completed}});
  IF NOT rows THEN
    IF NOT {{schema}}.idem_put(k, v, ttl, now_ms, present) THEN RETURN -1; END IF;
    RETURN how;
  END IF;
  IF NOT {{schema}}.idem_put(k, substring(v FROM 1 FOR length(v) - 1), ttl, now_ms, present) THEN RETURN -1; END IF;
  DELETE FROM {{schema}}.chunks c WHERE c.key = k AND c.tok = own;
  INSERT INTO {{schema}}.chunks (key, tok, at, data, expires_ms)
    SELECT k, own, length(v) - 1, substring(v FROM length(v)), r.expires_ms FROM {{schema}}.records r WHERE r.key = k;
  RETURN how;
END $$;

-- The 8-byte big-endian number at position at (1-based) of v.
CREATE OR REPLACE FUNCTION {{schema}}.idem_rd8(v bytea, at int) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT ('x' || encode(substring(v FROM at FOR 8), 'hex'))::bit(64)::bigint $$;

-- res 1 appended (n: the new length), 0 gone, -1 not ours, -2 ended, -3
-- the lease had run out (marked aborted), -5 another length (n). rows:
-- the chunk goes in a row of its own (record_format 5).
CREATE OR REPLACE FUNCTION {{schema}}.idem_stream_append(k text, tok bytea, at bigint, chunk bytea, lease bigint, rows bool, OUT res int, OUT n bigint)
LANGUAGE plpgsql AS $$
DECLARE now_ms bigint := {{schema}}.idem_now(); cur bytea;
BEGIN
  SELECT g.cur INTO cur FROM {{schema}}.idem_get(k, now_ms) g;
  IF cur IS NULL THEN res := 0; RETURN; END IF;
  IF NOT {{schema}}.idem_ours(cur, tok) OR {{schema}}.idem_state(cur) <> 3 OR length(cur) < {{rec.streamHead.end}} THEN res := -1; RETURN; END IF;
  IF get_byte(cur, {{rec.streamEnd.off}}) <> 0 THEN res := -2; RETURN; END IF;
  IF {{schema}}.idem_rd8(cur, {{rec.completed.at}}) < now_ms THEN
    UPDATE {{schema}}.records SET value = set_byte(value, {{rec.streamEnd.off}}, 2) WHERE key = k;
    res := -3; RETURN;
  END IF;
  n := {{schema}}.idem_len(k, cur);
  IF n <> at THEN res := -5; RETURN; END IF;
  n := {{schema}}.idem_put_chunk(k, cur, n, chunk, rows, now_ms + lease);
  res := 1;
END $$;

-- res 1 recorded (or already, the same), 0 gone, -1 not ours, -2 ended
-- otherwise, -5 another length (n).
CREATE OR REPLACE FUNCTION {{schema}}.idem_stream_end(k text, tok bytea, e int, at bigint, last bytea, rows bool, OUT res int, OUT n bigint)
LANGUAGE plpgsql AS $$
DECLARE now_ms bigint := {{schema}}.idem_now(); cur bytea; was int;
BEGIN
  SELECT g.cur INTO cur FROM {{schema}}.idem_get(k, now_ms) g;
  IF cur IS NULL THEN res := 0; RETURN; END IF;
  IF NOT {{schema}}.idem_ours(cur, tok) OR {{schema}}.idem_state(cur) <> 3 OR length(cur) < {{rec.streamHead.end}} THEN res := -1; RETURN; END IF;
  was := get_byte(cur, {{rec.streamEnd.off}});
  IF was <> 0 THEN
    IF was = e THEN res := 1; ELSE res := -2; END IF;
    RETURN;
  END IF;
  n := {{schema}}.idem_len(k, cur);
  IF at >= 0 AND n <> at THEN res := -5; RETURN; END IF;
  IF e = 1 AND {{schema}}.idem_rd8(cur, {{rec.completed.at}}) < now_ms THEN
    UPDATE {{schema}}.records SET value = set_byte(value, {{rec.streamEnd.off}}, 2) WHERE key = k;
    res := -2; RETURN;
  END IF;
  cur := set_byte(cur, {{rec.streamEnd.off}}, e);
  IF e = 1 AND last IS NOT NULL AND length(last) > 0 THEN
    PERFORM {{schema}}.idem_put_chunk(k, cur, n, last, rows, now_ms);
  ELSE
    UPDATE {{schema}}.records SET value = overlay(cur PLACING int8send(now_ms) {{rec.completed}}) WHERE key = k;
  END IF;
  res := 1;
END $$;

-- A stream's first 74 bytes, its length, its bytes from offset "off"
-- (0-based), at most max, and the database's clock.
CREATE OR REPLACE FUNCTION {{schema}}.idem_stream_read(k text, off bigint, max_n bigint, OUT head bytea, OUT n bigint, OUT data bytea, OUT now_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE cur bytea; t bytea; base bigint; first_at bigint; buf bytea;
BEGIN
  now_ms := {{schema}}.idem_now();
  SELECT r.value INTO cur FROM {{schema}}.records r WHERE r.key = k AND r.expires_ms > now_ms;
  IF NOT FOUND THEN head := ''::bytea; n := 0; data := ''::bytea; RETURN; END IF;
  head := substring(cur {{rec.streamHead}});
  n := {{schema}}.idem_len(k, cur);
  data := ''::bytea;
  IF off < length(cur) THEN data := substring(cur FROM (off + 1)::int FOR max_n::int); END IF;
  base := off + length(data);
  IF base >= n OR length(data) >= max_n THEN RETURN; END IF;
  -- The rest from the chunk rows: the one that holds byte base, and on.
  t := substring(cur {{rec.token}});
  SELECT max(c.at) INTO first_at FROM {{schema}}.chunks c WHERE c.key = k AND c.tok = t AND c.at <= base;
  IF first_at IS NULL THEN RETURN; END IF;
  SELECT string_agg(c.data, ''::bytea ORDER BY c.at) INTO buf FROM {{schema}}.chunks c
    WHERE c.key = k AND c.tok = t AND c.at >= first_at AND c.at < off + max_n;
  data := data || substring(COALESCE(buf, ''::bytea) FROM (base - first_at + 1)::int FOR (max_n - length(data))::int);
END $$;

-- A marker (since:<name>, epoch): created with value when missing; its
-- value either way.
CREATE OR REPLACE FUNCTION {{schema}}.idem_marker(nm text, v text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE cur text;
BEGIN
  INSERT INTO {{schema}}.markers (name, value) VALUES (nm, v) ON CONFLICT (name) DO NOTHING;
  SELECT m.value INTO cur FROM {{schema}}.markers m WHERE m.name = nm;
  RETURN cur;
END $$;

-- The standbys that have every commit this server acknowledges, as its
-- synchronous_standby_names names them: the first n of a FIRST n (or
-- plain) list, every name of an ANY n list of n; NULL when commits wait
-- for no standby, '' when they wait for one nobody can name beforehand
-- ('*', or a quorum of fewer than all).
CREATE OR REPLACE FUNCTION {{schema}}.idem_sync_names() RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
  s text; m text[]; n int; list text[];
BEGIN
  IF current_setting('synchronous_commit') NOT IN ('on', 'remote_write', 'remote_apply') THEN RETURN NULL; END IF;
  s := btrim(current_setting('synchronous_standby_names'));
  IF s = '' THEN RETURN NULL; END IF;
  m := regexp_match(s, '^(?:(FIRST|ANY)\s+)?(\d+)\s*\((.*)\)$', 'i');
  IF m IS NULL THEN
    n := 1; list := string_to_array(s, ',');
  ELSE
    n := m[2]::int; list := string_to_array(m[3], ',');
  END IF;
  list := ARRAY(SELECT lower(btrim(btrim(x.name), '"')) FROM unnest(list) WITH ORDINALITY AS x(name, i) ORDER BY x.i);
  IF '*' = ANY (list) THEN RETURN ''; END IF;
  IF m IS NOT NULL AND upper(m[1]) = 'ANY' THEN
    IF n >= cardinality(list) THEN RETURN array_to_string(list, ','); END IF;
    RETURN '';
  END IF;
  RETURN array_to_string(list[1:n], ',');
END $$;

-- The watermark a value of the records' server row holds: epoch:N; the
-- bare "epoch" an earlier release wrote is 0.
CREATE OR REPLACE FUNCTION {{schema}}.idem_watermark(v bytea) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN v IS NULL OR v = convert_to('epoch', 'UTF8') THEN 0
    ELSE COALESCE(NULLIF(split_part(convert_from(v, 'UTF8'), ':', 2), '')::bigint, 0) END
$$;

-- The store's epoch, with the server it lives on and a watermark (issues
-- 62, 78). nm is the epoch marker, as idem_marker reads it (v: its value
-- when created); srv the marker of the server the epoch was last seen
-- on: its system identifier, its timeline, whether commits waited for a
-- synchronous standby, and which standbys had every commit
-- (idem_sync_names). A row of records under the same name, which never
-- expires, stands for the records themselves, and holds the watermark: a
-- counter every look raises by one (mark, returned; started is when the
-- server's postmaster started); seen is the highest
-- a sidecar saw (0: none yet) in the epoch it last saw, seen_epoch (a
-- sidecar that finds the epoch changed since adopts the new one: another
-- sidecar already told the loss). Acknowledged records may be gone, and the
-- epoch marker is replaced with lost (a new epoch, after a loss; why says
-- so), when:
--  * the system identifier changed (a restore into another cluster);
--  * the timeline changed, unless the server now primary was one of the
--    standbys that had every commit (its cluster_name, which a standby's
--    walreceiver gives the primary as its application_name, among the
--    names): a failover to an asynchronous standby, a point-in-time
--    restore. The synchronous flag is the promoted server's, not the
--    cluster's: a cluster with a synchronous standby and an asynchronous
--    one loses writes when the asynchronous one is promoted;
--  * the records' row is gone (a TRUNCATE, the table restored without it);
--  * the watermark is below seen: the records went back (a base backup
--    restored, one table restored from a dump, WAL lost to pg_resetwal, a
--    restore into a new cluster whatever the role may read);
--  * the epoch marker is not the one seen_epoch names, nor a later one
--    after a loss (the markers restored, or deleted).
-- Before srv exists nothing is taken for a loss. The server's marker row
-- is locked (idemproxy's own table), never an advisory lock, which any
-- role that can connect may take.
CREATE OR REPLACE FUNCTION {{schema}}.idem_epoch(nm text, v text, srv text, lost text, seen bigint, seen_epoch text,
  OUT epoch text, OUT why text, OUT mark bigint, OUT started bigint)
LANGUAGE plpgsql AS $$
DECLARE
  sys text; tl text; names text; me text; cur text; parts text[]; kept bool; now_epoch text;
BEGIN
  -- A managed service may keep these from the role: the server is then
  -- "unknown", and the watermark and the markers' own rows tell a loss.
  sys := 'unknown'; tl := 'unknown';
  IF has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE') THEN
    SELECT c.system_identifier::text INTO sys FROM pg_control_system() c;
  END IF;
  IF has_function_privilege('pg_catalog.pg_walfile_name(pg_lsn)', 'EXECUTE') AND has_function_privilege('pg_catalog.pg_current_wal_lsn()', 'EXECUTE') THEN
    tl := substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8);
  END IF;
  names := {{schema}}.idem_sync_names();
  me := lower(current_setting('cluster_name'));
  INSERT INTO {{schema}}.markers (name, value) VALUES (srv, '') ON CONFLICT (name) DO NOTHING;
  SELECT m.value INTO cur FROM {{schema}}.markers m WHERE m.name = srv FOR UPDATE;
  UPDATE {{schema}}.records r SET value = convert_to('epoch:' || ({{schema}}.idem_watermark(r.value) + 1)::text, 'UTF8')
    WHERE r.key = srv RETURNING {{schema}}.idem_watermark(r.value) INTO mark;
  kept := FOUND;
  IF NOT kept THEN
    INSERT INTO {{schema}}.records (key, value, expires_ms) VALUES (srv, convert_to('epoch:1', 'UTF8'), 9223372036854775807);
    mark := 1;
  END IF;
  IF cur <> '' THEN
    parts := string_to_array(cur, ':');
    IF parts[1] <> sys AND parts[1] <> 'unknown' AND sys <> 'unknown' THEN
      why := 'the database''s system identifier changed from ' || parts[1] || ' to ' || sys || ' (a restore into another cluster)';
    ELSIF parts[2] <> tl AND parts[2] <> 'unknown' AND tl <> 'unknown' AND NOT (parts[3] = 'sync' AND
        (cardinality(parts) < 4 OR (me <> '' AND me = ANY (string_to_array(parts[4], ','))))) THEN
      why := 'the database''s timeline changed from ' || parts[2] || ' to ' || tl || ' on a server that was not a synchronous standby of the last primary (' ||
        CASE WHEN me = '' THEN 'this server has no cluster_name' ELSE 'this server is ' || me END ||
        CASE WHEN parts[3] = 'sync' THEN ', the synchronous ones: ' || COALESCE(NULLIF(parts[4], ''), 'not named') ELSE ', none was' END ||
        '): a failover to an asynchronous standby, or a point-in-time restore';
    ELSIF NOT kept THEN
      why := 'the records table lost its marker row (a TRUNCATE, or the table restored on its own)';
    END IF;
  END IF;
  SELECT m.value INTO now_epoch FROM {{schema}}.markers m WHERE m.name = nm;
  -- The epoch changes only to a later epoch after a loss, which another
  -- sidecar began: any other change (the marker gone, or back to an older
  -- one with the markers restored) is a loss of its own.
  IF why IS NULL AND seen_epoch IS NOT NULL AND now_epoch IS DISTINCT FROM seen_epoch AND NOT (now_epoch LIKE '%:lost'
      AND split_part(now_epoch, ':', 1)::bigint > split_part(seen_epoch, ':', 1)::bigint) THEN
    why := 'the epoch marker went back: it is ' || COALESCE(now_epoch, 'gone') || ', this sidecar saw ' || seen_epoch || ' (the markers restored from an older copy, or deleted)';
  END IF;
  IF why IS NULL AND seen > 0 AND mark - 1 < seen AND now_epoch IS NOT DISTINCT FROM seen_epoch THEN
    why := 'the records went back: their watermark is ' || (mark - 1) || ', below the ' || seen || ' this sidecar saw (an older copy restored: a base backup, a dump, or WAL lost to pg_resetwal)';
  END IF;
  IF why IS NOT NULL THEN
    INSERT INTO {{schema}}.markers (name, value) VALUES (nm, lost)
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value;
  END IF;
  parts := ARRAY[cur, sys || ':' || tl || ':' || CASE WHEN names IS NULL THEN 'async' ELSE 'sync' END || ':' || COALESCE(names, '')];
  IF parts[1] IS DISTINCT FROM parts[2] THEN
    UPDATE {{schema}}.markers SET value = parts[2] WHERE name = srv;
  END IF;
  SELECT m.value INTO epoch FROM {{schema}}.markers m WHERE m.name = nm;
  IF NOT FOUND THEN
    INSERT INTO {{schema}}.markers (name, value) VALUES (nm, v) ON CONFLICT (name) DO NOTHING;
    SELECT m.value INTO epoch FROM {{schema}}.markers m WHERE m.name = nm;
  END IF;
  -- When this server's postmaster started: a claim that finds another
  -- knows it talks to another server (restarted, restored, failed over),
  -- and the epoch is looked at again before its answer stands.
  started := (EXTRACT(epoch FROM pg_catalog.pg_postmaster_start_time()) * 1000000)::bigint;
END $$;

-- Counts the new keys of a batch's claims against their quotas
-- (claim.Quota), in a transaction of its own after the claims' commit: a
-- claim is sent with no quota, and this counts, in the order of its
-- counters' keys (qkeys, sorted by the caller), each key of keys that the
-- claims took (its record in progress with tok's token: a claim that
-- failed, or whose transaction did, counts nothing). Its commit does not
-- wait for the WAL's flush (a count lost to a crash lets a few keys more
-- through; a refusal lost so leaves its record to lapse with its lease),
-- so a principal's counter row is locked for microseconds, not for a
-- commit: counted inside the claims' transaction, batches of one
-- principal queued on that row one commit at a time (0.66x the first
-- attempts without a quota, measured), and with two principals they
-- deadlocked (issue 78). The counters are taken in key order and no claim
-- takes one, so no two transactions wait on each other in a circle. A key
-- over its quota (qlimits, per qwindows ms) is deleted and returned in
-- refused, with retry_ms what is left of its window. Each counter is
-- written once a batch, not once a key.
CREATE OR REPLACE FUNCTION {{schema}}.idem_count(keys text[], toks bytea[], qkeys text[], qlimits bigint[], qwindows bigint[],
  OUT refused text[], OUT retry_ms bigint[])
LANGUAGE plpgsql AS $$
DECLARE
  now_ms bigint; qn bigint; qexp bigint; g record; base bigint; gone int;
BEGIN
  refused := '{}'; retry_ms := '{}';
  PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
  now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  -- Each counter once, by as many keys as its claims took, as if each
  -- had added one and taken it back when over its limit.
  FOR g IN
    SELECT u.q, array_agg(u.k ORDER BY u.i) AS ks, array_agg(u.t ORDER BY u.i) AS ts, array_agg(u.l ORDER BY u.i) AS ls, min(u.w) AS w
    FROM unnest(keys, toks, qkeys, qlimits, qwindows) WITH ORDINALITY AS u(k, t, q, l, w, i)
    JOIN {{schema}}.records r ON r.key = u.k AND r.expires_ms > now_ms AND length(r.value) >= {{rec.token.end}}
      AND get_byte(r.value, {{rec.state.off}}) = 1 AND substring(r.value {{rec.token}}) = u.t
    GROUP BY u.q ORDER BY u.q
  LOOP
    INSERT INTO {{schema}}.counters AS c (key, n, expires_ms) VALUES (g.q, cardinality(g.ks), now_ms + g.w)
    ON CONFLICT (key) DO UPDATE SET
      n = CASE WHEN c.expires_ms <= now_ms THEN EXCLUDED.n ELSE c.n + EXCLUDED.n END,
      expires_ms = CASE WHEN c.expires_ms <= now_ms THEN EXCLUDED.expires_ms ELSE c.expires_ms END
    RETURNING c.n, c.expires_ms INTO qn, qexp;
    base := qn - cardinality(g.ks); gone := 0;
    FOR j IN 1 .. cardinality(g.ks) LOOP
      CONTINUE WHEN base + j - gone <= g.ls[j];
      DELETE FROM {{schema}}.records WHERE key = g.ks[j] AND substring(value {{rec.token}}) = g.ts[j];
      refused := refused || g.ks[j];
      retry_ms := retry_ms || (qexp - now_ms);
      gone := gone + 1;
    END LOOP;
    IF gone > 0 THEN
      UPDATE {{schema}}.counters AS c SET n = c.n - gone WHERE c.key = g.q;
    END IF;
  END LOOP;
END $$;

-- Wakes the waiters of keys (notify.go): a NOTIFY on channel idemproxy,
-- the key as its payload, for each key with a waiter registered. It
-- writes nothing: the sidecar calls it once the write committed, as a
-- statement of its own, so that no write depends on a wake-up.
CREATE OR REPLACE FUNCTION {{schema}}.idem_wake(keys text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_catalog.pg_notify('idemproxy', w.key) FROM {{schema}}.waiters w WHERE w.key = ANY (keys) GROUP BY w.key;
END $$;

-- Deletes up to lim expired rows, oldest first, by the index on
-- expires_ms: expiry never scans the table. Returns how many.
CREATE OR REPLACE FUNCTION {{schema}}.idem_expire(lim int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE now_ms bigint := {{schema}}.idem_now(); gone int;
BEGIN
  DELETE FROM {{schema}}.records WHERE key IN (
    SELECT key FROM {{schema}}.records WHERE expires_ms <= now_ms ORDER BY expires_ms LIMIT lim FOR UPDATE SKIP LOCKED);
  GET DIAGNOSTICS gone = ROW_COUNT;
  DELETE FROM {{schema}}.counters WHERE key IN (
    SELECT key FROM {{schema}}.counters WHERE expires_ms <= now_ms LIMIT lim FOR UPDATE SKIP LOCKED);
  DELETE FROM {{schema}}.chunks WHERE (key, tok, at) IN (
    SELECT key, tok, at FROM {{schema}}.chunks WHERE expires_ms <= now_ms ORDER BY expires_ms LIMIT lim FOR UPDATE SKIP LOCKED);
  DELETE FROM {{schema}}.waiters WHERE (key, id) IN (
    SELECT key, id FROM {{schema}}.waiters WHERE until_ms <= now_ms LIMIT lim FOR UPDATE SKIP LOCKED);
  RETURN gone;
END $$;

-- What the store watcher reports every second, by the indexes alone:
-- the expired rows not deleted yet (up to 10,000), how long ago the
-- oldest expired (ms), the oldest claim in progress's age (ms, from its
-- Created time at bytes 52..59), and the table's estimated rows.
CREATE OR REPLACE FUNCTION {{schema}}.idem_cleanup(OUT now_ms bigint, OUT expired bigint, OUT lag_ms bigint, OUT oldest_claim_ms bigint, OUT est_rows bigint)
LANGUAGE plpgsql AS $$
BEGIN
  now_ms := {{schema}}.idem_now();
  SELECT count(*) INTO expired FROM (SELECT 1 FROM {{schema}}.records WHERE expires_ms <= now_ms LIMIT 10000) e;
  SELECT now_ms - min(expires_ms) INTO lag_ms FROM {{schema}}.records WHERE expires_ms <= now_ms;
  SELECT now_ms - min({{schema}}.idem_rd8(value, {{rec.created.at}})) INTO oldest_claim_ms FROM {{schema}}.records
    WHERE substring(value {{rec.state}}) = '\x01'::bytea AND expires_ms > now_ms AND length(value) >= {{rec.created.end}};
  SELECT greatest(c.reltuples, 0)::bigint INTO est_rows FROM pg_class c WHERE c.oid = '{{schema}}.records'::regclass;
END $$;

INSERT INTO {{schema}}.versions (version, release) VALUES ({{version}}, '{{release}}')
ON CONFLICT (version) DO UPDATE SET release = EXCLUDED.release, installed_at = now();

-- This version's functions: a fixed search_path (every name in them is
-- qualified, or pg_catalog's), and EXECUTE for the roles granted it only.
DO $$
DECLARE f regprocedure;
BEGIN
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
    WHERE p.pronamespace = '{{schema}}'::regnamespace AND p.proname LIKE 'idem\_v{{version}}\_%' LOOP
    EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
  END LOOP;
END $$;
