//! `fieldgate history migrate --from redb --to postgres`: a data directory's history
//! copied to the PostgreSQL database `history.postgres_url_env` names, with a progress
//! line, resumable, checked at the end (see `store/history_migrate.rs`).

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use super::{fail, out};
use crate::config::Config;
use crate::store::HistoryStore;
use crate::store::pg::Pg;

pub fn migrate(config: &Config, dir: &Path, from: &str, to: &str) -> ExitCode {
    if (from, to) != ("redb", "postgres") {
        return fail(2, "history migrate copies from redb to postgres: --from redb --to postgres");
    }
    let var = &config.history.postgres_url_env;
    let Some(url) = std::env::var(var).ok().filter(|u| !u.trim().is_empty()) else {
        return fail(
            2,
            &format!(
                "the environment variable {var} (history.postgres_url_env) is not set: set it to the database's URL"
            ),
        );
    };
    let dir = crate::app::absolute(dir);
    if !dir.join("history.redb").exists() {
        return fail(1, &format!("no history in {} (no history.redb there)", dir.display()));
    }
    let store = match HistoryStore::open_in(&dir) {
        Ok(s) => s,
        Err(e) if e.to_string().contains("in use by another fieldgate process") => {
            return fail(
                1,
                &format!(
                    "{} is held by a running fieldgate: stop it, migrate, then start it with history.backend = \"postgres\"",
                    dir.display()
                ),
            );
        }
        Err(e) => return fail(1, &e.to_string()),
    };
    // Points a crash left in the journal go into chunks first.
    if let Err(e) = store.flush_all() {
        return fail(1, &e.to_string());
    }
    let pg = match Pg::start_with(&url, config.history.postgres_ca_file.as_deref()) {
        Ok((pg, None)) => pg,
        Ok((_, Some(e))) | Err(e) => return fail(1, &e.to_string()),
    };
    let tty = std::io::stderr().is_terminal();
    let mut shown = u64::MAX;
    let progress = |done: u64, total: u64| {
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        if tty {
            eprint!("\rmigrating history: {done} of {total} chunks ({pct} %)   ");
        } else if pct / 10 != shown / 10 || done == total {
            shown = pct;
            eprintln!("migrating history: {done} of {total} chunks ({pct} %)");
        }
    };
    let migrated = store.migrate_to(&pg, progress);
    if tty {
        eprintln!();
    }
    match migrated {
        Ok(m) => {
            let resumed = if m.resumed_after > 0 {
                format!(" (resumed after {} copied before)", m.resumed_after)
            } else {
                String::new()
            };
            out(&format!(
                "migrated {} chunks ({} points) of {} sensors to PostgreSQL{resumed}; checked: each sensor's chunks and points are the same here and there",
                m.chunks, m.points, m.sensors
            ));
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, &format!("{e}; run the same command again: it goes on where it stopped")),
    }
}
