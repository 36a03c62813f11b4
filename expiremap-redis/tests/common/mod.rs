//! A real `redis-server` for the tests: on a free loopback port, in its own
//! temporary directory, without persistence, killed when the guard drops.
#![allow(dead_code, unreachable_pub)]

pub mod cluster;

use std::collections::HashSet;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A generous deadline for anything that must happen "eventually": the
/// tests assert only what holds however slow the machine is.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub struct Server {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// With [`Server::start_tls`]: the PEM of the CA that signed the
    /// server's certificate (the server listens for TLS only).
    pub ca_pem: Option<Vec<u8>>,
}

fn binary() -> String {
    let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    match Command::new(&bin).arg("--version").output() {
        Ok(o) if o.status.success() => bin,
        _ => panic!(
            "`{bin}` not found: these tests need a real Redis 7 server. \
             Install it with `apt-get install redis-server` (Debian/Ubuntu), \
             or set REDIS_SERVER to its path."
        ),
    }
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// A server with extra command-line settings (`["--requirepass", "x"]`).
    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_with_ports(|| extra.iter().map(|a| a.to_string()).collect())
    }

    /// A server with the extra settings `extra` makes, made again (with
    /// new ports it may pick with [`free_port`]) if the server could not
    /// take its port: a port picked free can be taken by another program
    /// before the server binds it.
    pub fn start_with_ports(mut extra: impl FnMut() -> Vec<String>) -> Server {
        let mut last = String::new();
        for _ in 0..5 {
            let args = extra();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut s = Server::prepare(&args);
            match s.try_spawn() {
                Ok(()) => return s,
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start: {last}")
    }

    /// A port and a directory, no process yet.
    fn prepare(extra: &[&str]) -> Server {
        static N: AtomicU32 = AtomicU32::new(0);
        watchdog();
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "expiremap-redis-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        Server {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            ca_pem: None,
        }
    }

    /// A server that speaks TLS only (`--port 0 --tls-port P`), with a
    /// throwaway CA and server certificate (for `127.0.0.1` and
    /// `localhost`) made here with the `openssl` command; clients are not
    /// asked for certificates.
    pub fn start_tls() -> Server {
        let mut s = Server::prepare(&[]);
        let dir = s.dir.clone();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("the openssl command (apt-get install openssl)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=expiremap-redis test CA",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write san.ext");
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
        s.extra = vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            s.port.to_string(),
            "--tls-cert-file".into(),
            path("server.crt"),
            "--tls-key-file".into(),
            path("server.key"),
            "--tls-ca-cert-file".into(),
            path("ca.crt"),
            "--tls-auth-clients".into(),
            "no".into(),
            "--notify-keyspace-events".into(),
            "Ex".into(),
        ];
        s.ca_pem = Some(std::fs::read(dir.join("ca.crt")).expect("read ca.crt"));
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("redis-server did not start: {e}");
        }
    }

    /// Starts the process and waits until it accepts connections. An error
    /// if it exits first, or if what answers on the port is another server
    /// (checked by its directory, for plain servers).
    fn try_spawn(&mut self) -> Result<(), String> {
        let child = Command::new(binary())
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let t0 = Instant::now();
        let exited = |s: &mut Server| {
            s.child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
                .map(|status| format!("port {}: it exited ({status})", s.port))
        };
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(e) = exited(self) {
                self.child = None;
                return Err(e);
            }
            assert!(t0.elapsed() < PATIENCE, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        if self.ca_pem.is_some() {
            return Ok(());
        }
        // Ours, or another that holds the port (ours then exits)?
        let dir: Option<Vec<String>> = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(PATIENCE))
            .and_then(|mut c| redis::cmd("CONFIG").arg("GET").arg("dir").query(&mut c))
            .ok();
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        let ours = match (&dir, &name) {
            (Some(d), Some(n)) => d.len() == 2 && d[1].ends_with(n.as_str()),
            // `CONFIG` refused (a password, a renamed command): ours if it
            // has not exited by now.
            _ => {
                std::thread::sleep(Duration::from_millis(50));
                exited(self).is_none()
            }
        };
        if !ours {
            self.kill();
            return Err(format!(
                "port {}: another server answers ({dir:?})",
                self.port
            ));
        }
        Ok(())
    }

    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// A plain client of our own, as another program would use Redis. Its
    /// connect, reads and writes wait at most [`PATIENCE`]: a test that
    /// talks to a server that does not answer fails instead of hanging.
    pub fn raw(&self) -> redis::Connection {
        let c = redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(PATIENCE))
            .expect("a raw connection");
        c.set_read_timeout(Some(PATIENCE))
            .and_then(|()| c.set_write_timeout(Some(PATIENCE)))
            .expect("timeouts on a raw connection");
        c
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Kills the server (SIGKILL: no goodbye on the connections) and waits.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a fresh, empty server on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP / SIGCONT: the server stops answering but keeps its sockets.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .map(|s| s.success());
        assert_eq!(ok.ok(), Some(true), "kill {sig}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_ref() {
            // A stopped server would not die of SIGKILL any later, but make
            // sure it is not left frozen.
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port that the system says is free and that no other server
/// of this process was given: the tests start servers in parallel.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}

/// Joins `t`, a worker the test has told to stop, and returns what it
/// returned (its panic goes on); fails the test, printing every thread's
/// stack, if it has not ended within `limit`: a call stuck past its
/// timeouts then names itself instead of hanging the test binary.
pub fn join_within<T>(what: &str, t: std::thread::JoinHandle<T>, limit: Duration) -> T {
    let t0 = Instant::now();
    while !t.is_finished() {
        assert!(
            t0.elapsed() <= limit,
            "{what}: still running {limit:?} after the stop\n{}",
            stacks()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Runs `f` on a thread of its own and returns what it returns, or panics
/// after [`PATIENCE`]: a call that would wait for ever fails the test
/// instead of hanging it (the thread is left behind).
pub fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(t) => t,
        Err(e) => panic!("{what}: no answer within {PATIENCE:?} ({e})"),
    }
}

/// Runs `cmd` (its output captured) and returns its output, or, if it has
/// not ended within `limit`, kills it and returns an error with what it
/// printed: a tool that would wait for ever (`redis-cli` waiting for a
/// cluster to agree, or for a node that does not answer) fails the test
/// that called it instead of hanging it.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Result<std::process::Output, String> {
    use std::io::Read;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    fn drain<R: Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    }
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let t0 = Instant::now();
    // Most commands end in a few milliseconds: look often at first.
    let mut nap = Duration::from_micros(200);
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("{what}: {e}"))? {
            break Some(status);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    };
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    match status {
        Some(status) => Ok(std::process::Output {
            status,
            stdout,
            stderr,
        }),
        None => Err(format!(
            "{what} did not end within {limit:?}; it printed: {}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        )),
    }
}

/// The stack of every thread of this process, where `gdb` is installed
/// (else a line saying it is not): printed by a test that finds a thread
/// stuck, so that a hang seen once says where it was.
pub fn stacks() -> String {
    // gdb stops every thread of this process while it prints: its output
    // goes to a file, never to a pipe that a stopped thread would drain.
    let pid = std::process::id();
    let path = std::env::temp_dir().join(format!("expiremap-redis-stacks-{pid}"));
    let file = match std::fs::File::create(&path) {
        Ok(f) => f,
        Err(e) => return format!("(no stacks: {e})"),
    };
    let r = Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt",
        ])
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(Stdio::null())
        .status();
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    match r {
        Ok(_) => text,
        Err(e) => format!("(no stacks: gdb: {e})"),
    }
}

/// How long a test binary may run from its first server: the whole suite
/// ends in a few minutes on a slow machine; past this something hangs.
const WHOLE_RUN: Duration = Duration::from_secs(30 * 60);

/// Started with the first server: if the process still runs after
/// [`WHOLE_RUN`], prints every thread's stack and exits with a failure,
/// so that a hang anywhere (ours, a tool's, a test's) is a failed run that
/// says where, not a run that never ends.
fn watchdog() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        std::thread::spawn(|| {
            std::thread::sleep(WHOLE_RUN);
            eprintln!(
                "the tests still run after {WHOLE_RUN:?}: something hangs; every thread:\n{}",
                stacks()
            );
            std::process::exit(101);
        });
    });
}

/// Polls `f` until it returns `Some`, or panics after [`PATIENCE`].
pub fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(t0.elapsed() < PATIENCE, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A load of `key` through `cache` on its own thread that, once it has
/// started (its lease taken), holds until the returned sender sends, then
/// loads `value`. Returns after the load has started.
pub fn held_load(
    cache: &std::sync::Arc<expiremap_redis::NearCache<String, u64>>,
    key: &str,
    value: u64,
) -> (std::thread::JoinHandle<u64>, std::sync::mpsc::Sender<()>) {
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let (cache, key) = (std::sync::Arc::clone(cache), key.to_string());
    let load = std::thread::spawn(move || {
        cache
            .get_or_insert_with(key, Duration::from_secs(3600), || {
                started_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                value
            })
            .unwrap()
    });
    within("the held load starts", move || started.recv().unwrap());
    (load, go)
}
