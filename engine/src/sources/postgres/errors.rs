//! Which Postgres failures pass on their own. A server that restarts, fails
//! over or drops the connection is retried from the committed positions
//! (see [`crate::supervisor`]); a wrong password, a missing privilege or a
//! slot the server invalidated is not, and ends the run with its cause.

use pgwire_replication::PgWireError;

use crate::sources::SourceError;

/// SQLSTATEs (or their classes) that say the server or the connection is
/// briefly away, not that the request is wrong.
fn transient_sqlstate(code: &str) -> bool {
    code.starts_with("08") // connection exception
        || matches!(
            code,
            "57P01" // admin_shutdown (fast shutdown, pg_terminate_backend)
                | "57P02" // crash_shutdown
                | "57P03" // cannot_connect_now (starting up, in recovery)
                | "57P05" // idle_session_timeout
                | "53300" // too_many_connections
                | "55006" // object_in_use: the slot is still held by the walsender of a client that just died
                | "40001" // serialization_failure
                | "40P01" // deadlock_detected
                | "58030" // io_error on the server
        )
}

/// Whether a SQL session's error may pass.
pub fn sql_is_transient(e: &sqlx::Error) -> bool {
    match e {
        // A refused certificate reaches sqlx as an I/O error.
        sqlx::Error::Io(io) => !super::tls::is_handshake_failure(&io.to_string()),
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| transient_sqlstate(&c)),
        _ => false,
    }
}

/// A SQL session's error while `doing`, classified, with any URI
/// credentials removed.
pub fn sql(doing: &str, e: &sqlx::Error) -> SourceError {
    classified(doing, e, sql_is_transient(e))
}

/// `doing: error` with credentials removed, transient or not.
fn classified(doing: &str, e: &dyn std::fmt::Display, transient: bool) -> SourceError {
    let message = format!(
        "{doing}: {}",
        urutau_planner::options::redact_text(&e.to_string())
    );
    SourceError {
        message,
        transient,
        schema_change: None,
    }
}

/// Whether a replication connection's error may pass: the connection was
/// lost (I/O), or the server says it is shutting down or starting.
pub fn replication_is_transient(e: &PgWireError) -> bool {
    match e {
        PgWireError::Server(text) => text
            .split("SQLSTATE ")
            .nth(1)
            .map(|rest| rest.chars().take(5).collect::<String>())
            .is_some_and(|code| transient_sqlstate(&code)),
        PgWireError::Io(io) => !super::tls::is_handshake_failure(&io.to_string()),
        other => other.is_transient(),
    }
}

/// A replication connection's error while `doing`, classified.
pub fn replication(doing: &str, e: &PgWireError) -> SourceError {
    classified(doing, e, replication_is_transient(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn lost_connections_and_shutdowns_pass_configuration_errors_do_not() {
        let eof = PgWireError::Io(Arc::new(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "EOF while reading backend message header",
        )));
        assert!(replication("replication from slot s", &eof).transient);
        let shutdown = PgWireError::Server(
            "terminating connection due to administrator command (SQLSTATE 57P01)".into(),
        );
        assert!(replication_is_transient(&shutdown));
        let starting =
            PgWireError::Server("the database system is starting up (SQLSTATE 57P03)".into());
        assert!(replication_is_transient(&starting));
        let invalidated = PgWireError::Server(
            "cannot read from logical replication slot \"s\" (SQLSTATE 55000)".into(),
        );
        assert!(!replication_is_transient(&invalidated));
        assert!(!replication_is_transient(&PgWireError::Auth(
            "password authentication failed".into()
        )));
        assert!(sql_is_transient(&sqlx::Error::PoolTimedOut));
        assert!(!sql_is_transient(&sqlx::Error::RowNotFound));
        assert!(
            sql(
                "connecting to Postgres",
                &sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
            )
            .transient
        );
    }
}
