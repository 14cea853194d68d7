//! The SQL of the history schema: creating and migrating it, the day partitions, the
//! sensor catalogue, shipments, range reads, counts and retention (a child of `pg`, whose
//! connection thread calls these).

use std::collections::HashSet;

use tokio_postgres::Client;

use super::{AHEAD_DAYS, Cache, Chunk, DAY_MS, Dropped, PgError, SCHEMA_LOCK, SCHEMA_VERSION, Stored, db};

/// Creates the schema, or brings an older one up to this binary's; refuses a newer one.
pub(super) async fn migrate(client: &mut Client) -> Result<(), PgError> {
    let tx = client.transaction().await.map_err(db)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK]).await.map_err(db)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS fieldgate_schema (id integer PRIMARY KEY CHECK (id = 1), version integer NOT NULL)",
    )
    .await
    .map_err(db)?;
    let found: Option<i32> = tx
        .query_opt("SELECT version FROM fieldgate_schema WHERE id = 1", &[])
        .await
        .map_err(db)?
        .map(|r| r.get(0));
    match found {
        Some(v) if v > SCHEMA_VERSION => return Err(PgError::Newer { found: v, known: SCHEMA_VERSION }),
        Some(v) if v == SCHEMA_VERSION => {}
        Some(_) | None => {
            // Version 1: the first. (A later version adds its steps after this one.)
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS fieldgate_sensors (
                     id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                     name text NOT NULL UNIQUE);
                 CREATE TABLE IF NOT EXISTS fieldgate_chunks (
                     sensor integer NOT NULL,
                     first_t bigint NOT NULL,
                     chunk bigint NOT NULL,
                     last_t bigint NOT NULL,
                     points integer NOT NULL,
                     data bytea NOT NULL,
                     PRIMARY KEY (sensor, first_t, chunk)
                 ) PARTITION BY RANGE (first_t);
                 CREATE TABLE IF NOT EXISTS fieldgate_meta (key text PRIMARY KEY, value text NOT NULL);
                 INSERT INTO fieldgate_meta (key, value)
                     VALUES ('database_id', md5(random()::text || clock_timestamp()::text))
                     ON CONFLICT (key) DO NOTHING;
                 INSERT INTO fieldgate_schema (id, version) VALUES (1, 1)
                     ON CONFLICT (id) DO UPDATE SET version = 1;",
            )
            .await
            .map_err(db)?;
        }
    }
    tx.commit().await.map_err(db)
}

/// The partition of day `day` (days since 1970; one before is `dm<n>`).
fn partition(day: i64) -> String {
    if day < 0 {
        format!("fieldgate_chunks_dm{}", day.unsigned_abs())
    } else {
        format!("fieldgate_chunks_d{day}")
    }
}

/// The day of partition `name`.
fn day_of(name: &str) -> Option<i64> {
    let d = name.strip_prefix("fieldgate_chunks_d")?;
    match d.strip_prefix('m') {
        Some(n) => n.parse::<i64>().ok().map(|n| -n),
        None => d.parse().ok(),
    }
}

/// The partitions of `days` made if missing (two fieldgates may race to make one: the
/// loser finds it made).
async fn ensure_days(
    client: &Client,
    cache: &mut Cache,
    days: impl IntoIterator<Item = i64>,
) -> Result<(), PgError> {
    for day in days {
        if cache.days.contains(&day) {
            continue;
        }
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} PARTITION OF fieldgate_chunks FOR VALUES FROM ({}) TO ({})",
            partition(day),
            day * DAY_MS,
            (day + 1) * DAY_MS
        );
        match client.batch_execute(&sql).await {
            Ok(()) => {}
            Err(e) if e.code().is_some_and(|c| c.code() == "42P07" || c.code() == "23505") => {}
            Err(e) => return Err(db(e)),
        }
        cache.days.insert(day);
    }
    Ok(())
}

/// The catalogue's ID of each of `names`, adding those it lacks.
async fn sensor_ids(client: &Client, cache: &mut Cache, names: &[&str]) -> Result<(), PgError> {
    let missing: Vec<&str> = {
        let mut seen = HashSet::new();
        names.iter().copied().filter(|n| !cache.sensors.contains_key(*n) && seen.insert(*n)).collect()
    };
    if missing.is_empty() {
        return Ok(());
    }
    client
        .execute(
            "INSERT INTO fieldgate_sensors (name) SELECT unnest($1::text[]) ON CONFLICT (name) DO NOTHING",
            &[&missing],
        )
        .await
        .map_err(db)?;
    for row in client
        .query("SELECT id, name FROM fieldgate_sensors WHERE name = ANY($1::text[])", &[&missing])
        .await
        .map_err(db)?
    {
        cache.sensors.insert(row.get(1), row.get(0));
    }
    Ok(())
}

pub(super) async fn ship(client: &mut Client, cache: &mut Cache, chunks: &[Chunk]) -> Result<(), PgError> {
    if chunks.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = chunks.iter().map(|c| c.sensor.as_str()).collect();
    sensor_ids(client, cache, &names).await?;
    let today = chrono::Utc::now().timestamp_millis().div_euclid(DAY_MS);
    let days: HashSet<i64> =
        chunks.iter().map(|c| c.first.div_euclid(DAY_MS)).chain(today..=today + AHEAD_DAYS).collect();
    ensure_days(client, cache, days).await?;
    let mut sensor = Vec::with_capacity(chunks.len());
    for c in chunks {
        sensor.push(
            *cache
                .sensors
                .get(&c.sensor)
                .ok_or_else(|| PgError::Db("a sensor has no catalogue ID".into()))?,
        );
    }
    let first: Vec<i64> = chunks.iter().map(|c| c.first).collect();
    let id: Vec<i64> = chunks.iter().map(|c| c.id).collect();
    let last: Vec<i64> = chunks.iter().map(|c| c.last).collect();
    let points: Vec<i32> = chunks.iter().map(|c| i32::try_from(c.points).unwrap_or(i32::MAX)).collect();
    let data: Vec<&[u8]> = chunks.iter().map(|c| c.bytes.as_slice()).collect();
    client
        .execute(
            "INSERT INTO fieldgate_chunks (sensor, first_t, chunk, last_t, points, data)
             SELECT * FROM unnest($1::integer[], $2::bigint[], $3::bigint[], $4::bigint[], $5::integer[], $6::bytea[])
             ON CONFLICT (sensor, first_t, chunk) DO UPDATE
                 SET last_t = excluded.last_t, points = excluded.points, data = excluded.data
                 WHERE fieldgate_chunks.points <= excluded.points",
            &[&sensor, &first, &id, &last, &points, &data],
        )
        .await
        .map_err(db)?;
    Ok(())
}

const RANGE: &str = "SELECT c.first_t, c.chunk, c.data FROM fieldgate_chunks c
     WHERE c.sensor = (SELECT id FROM fieldgate_sensors WHERE name = $1)
       AND c.first_t >= $2 AND c.first_t < $3 AND c.last_t >= $4
     ORDER BY c.first_t, c.chunk";

pub(super) async fn range(
    client: &Client,
    cache: &mut Cache,
    sensor: &str,
    from: i64,
    to: i64,
    span: i64,
) -> Result<Vec<Stored>, PgError> {
    let stmt = match &cache.range {
        Some(s) => s.clone(),
        None => {
            let s = client.prepare(RANGE).await.map_err(db)?;
            cache.range = Some(s.clone());
            s
        }
    };
    let rows = client.query(&stmt, &[&sensor, &from.saturating_sub(span), &to, &from]).await.map_err(db)?;
    Ok(rows.into_iter().map(|r| Stored { first: r.get(0), id: r.get(1), bytes: r.get(2) }).collect())
}

pub(super) async fn counts(client: &Client, id: i64) -> Result<Vec<(String, i64, i64)>, PgError> {
    let rows = client
        .query(
            "SELECT s.name, count(*), coalesce(sum(c.points), 0)::bigint FROM fieldgate_chunks c
             JOIN fieldgate_sensors s ON s.id = c.sensor WHERE c.chunk = $1 GROUP BY s.name",
            &[&id],
        )
        .await
        .map_err(db)?;
    Ok(rows.into_iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
}

pub(super) async fn drop_before(
    client: &Client,
    cache: &mut Cache,
    older_than: i64,
) -> Result<Dropped, PgError> {
    let rows = client
        .query(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_inherits i
             JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
             WHERE p.relname = 'fieldgate_chunks'",
            &[],
        )
        .await
        .map_err(db)?;
    let mut out = Dropped::default();
    for r in rows {
        let name: String = r.get(0);
        let size: i64 = r.get(1);
        let Some(day) = day_of(&name) else { continue };
        if (day + 1) * DAY_MS <= older_than {
            client.batch_execute(&format!("DROP TABLE IF EXISTS {}", partition(day))).await.map_err(db)?;
            cache.days.remove(&day);
            out.partitions += 1;
            out.bytes += size.max(0) as u64;
        }
    }
    Ok(out)
}
