//! A TCP proxy in front of a real server, for network faults made by real
//! means. [`TcpProxy::cut`] resets every connection through it and
//! refuses new ones, as a network that drops a route does (the peers see
//! `connection reset`); [`TcpProxy::stall`] keeps every connection open
//! and passes nothing either way, new ones too, as a network that drops
//! packets silently does (no peer hears anything); [`TcpProxy::restore`]
//! lets bytes pass again (what a stall held goes on). The server itself
//! stays up: only the path to it changes.
//!
//! It runs on its own thread and runtime, so a test that blocks its own
//! thread (a harness call, a sleep) does not stall the bytes through it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Bytes pass both ways.
    Open,
    /// Every connection is reset, new ones too.
    Cut,
    /// Nothing passes; connections stay open.
    Stalled,
    /// The proxy is dropped: its thread ends.
    Gone,
}

/// A proxy listening on 127.0.0.1 that forwards to one upstream address.
pub struct TcpProxy {
    /// Where clients connect instead of the server.
    pub addr: SocketAddr,
    path: watch::Sender<Path>,
}

impl TcpProxy {
    /// Starts forwarding `127.0.0.1:<free port>` to `upstream`.
    pub fn start(upstream: SocketAddr) -> TcpProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (path, watching) = watch::channel(Path::Open);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(serve(listener, upstream, watching));
        });
        TcpProxy { addr, path }
    }

    /// `uri` (a `scheme://user@host:port/...` URI of the upstream) with its
    /// authority pointed at the proxy instead.
    pub fn uri_through(&self, uri: &str, upstream: SocketAddr) -> String {
        let through = uri.replace(&upstream.to_string(), &self.addr.to_string());
        assert_ne!(through, uri, "{uri} names {upstream}");
        through
    }

    /// Cuts the network: open connections are reset and new ones refused.
    pub fn cut(&self) {
        self.path.send_replace(Path::Cut);
    }

    /// Stalls the network: connections stay open, nothing passes.
    pub fn stall(&self) {
        self.path.send_replace(Path::Stalled);
    }

    /// Brings the network back: bytes pass and new connections reach the
    /// server again.
    pub fn restore(&self) {
        self.path.send_replace(Path::Open);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.path.send_replace(Path::Gone);
    }
}

async fn serve(listener: std::net::TcpListener, upstream: SocketAddr, path: watch::Receiver<Path>) {
    let listener = TcpListener::from_std(listener).unwrap();
    let mut gone = path.clone();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = gone.wait_for(|p| *p == Path::Gone) => return,
        };
        let Ok((client, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if *path.borrow() == Path::Cut {
            reset(client);
            continue;
        }
        tokio::spawn(forward(client, upstream, path.clone()));
    }
}

/// Waits while the path is stalled; whether it is open (not cut or gone).
async fn wait_open(path: &mut watch::Receiver<Path>) -> bool {
    match path.wait_for(|p| *p != Path::Stalled).await {
        Ok(p) => *p == Path::Open,
        Err(_) => false,
    }
}

/// Passes bytes between `client` and a new connection to `upstream` until
/// either side closes or the path is cut; while it is stalled nothing is
/// read or written (a connection made then waits too).
async fn forward(mut client: TcpStream, upstream: SocketAddr, mut path: watch::Receiver<Path>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if !wait_open(&mut path).await {
        reset(client);
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        reset(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut up, mut down) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        if !wait_open(&mut path).await {
            break;
        }
        tokio::select! {
            read = client.read(&mut up) => {
                let Ok(n @ 1..) = read else { return };
                if !wait_open(&mut path).await {
                    break;
                }
                if server.write_all(&up[..n]).await.is_err() {
                    return;
                }
            }
            read = server.read(&mut down) => {
                let Ok(n @ 1..) = read else { return };
                if !wait_open(&mut path).await {
                    break;
                }
                if client.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
            _ = path.changed() => {}
        }
    }
    reset(client);
    reset(server);
}

/// Closes `stream` with a reset (no orderly FIN), as a cut path does.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}
