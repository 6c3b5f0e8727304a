//! Graceful stop: SIGINT/SIGTERM (or a terminal error elsewhere) asks every
//! part of a run to finish the commit in flight and stop reading.

use std::sync::Arc;

use tokio::sync::watch;

/// A stop request shared by the parts of a run.
#[derive(Debug, Clone)]
pub struct Shutdown {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A stop request nobody has made yet.
    pub fn new() -> Self {
        let (tx, _) = watch::channel(false);
        Shutdown { tx: Arc::new(tx) }
    }

    /// Asks everything to stop.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// True once a stop was asked for.
    pub fn is_triggered(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once a stop was asked for.
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }

    /// Triggers on SIGINT or SIGTERM (first signal: graceful stop).
    pub fn listen_for_signals(&self) {
        let me = self.clone();
        tokio::spawn(async move {
            let ctrl_c = tokio::signal::ctrl_c();
            #[cfg(unix)]
            {
                let mut term =
                    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot listen for SIGTERM");
                            let _ = ctrl_c.await;
                            me.trigger();
                            return;
                        }
                    };
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            #[cfg(not(unix))]
            {
                let _ = ctrl_c.await;
            }
            tracing::info!("stop requested: finishing the commit in flight");
            me.trigger();
        });
    }
}
