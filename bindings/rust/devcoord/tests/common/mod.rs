//! Test fixture: a coordinator and workers started from the build tree's binaries on
//! 127.0.0.1 with free ports, killed (and their directory removed) on drop.
//!
//! Binaries: `$DEVCOORD_SERVER` and `$DEVCOORD_WORKER` (set by CTest), else
//! `$DEVCOORD_BUILD_DIR` (default: the repository's `build/`) + `server/...`.

use std::fs;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use devcoord::{Client, Options};

fn binary(env: &str, relative: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let build = std::env::var_os("DEVCOORD_BUILD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../build"));
    build.join(relative)
}

/// A port nothing listened on a moment ago and that this process has not handed out before
/// (tests run on parallel threads; the kernel may offer a port again before the daemon given
/// it first has bound it).
fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap();
    for _ in 0..1000 {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
    panic!("no TCP port on 127.0.0.1 that was not handed out already");
}

/// Tokens of a cluster started with auth (`token: role` tokens file at the coordinator).
pub const WORKER_TOKEN: &str = "dc-worker-rust-bindings-test-0001";
/// The trainer role's token.
pub const TRAINER_TOKEN: &str = "dc-trainer-rust-bindings-test-0001";

/// A running cluster; `addr` is the coordinator's address, `token` the trainer token the
/// fixture uses when the cluster has auth.
pub struct Cluster {
    pub addr: String,
    pub token: Option<String>,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for entry in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                if entry.path().extension().map_or(false, |e| e == "log") {
                    eprintln!("---- {:?}\n{}", entry.path(), fs::read_to_string(entry.path()).unwrap_or_default());
                }
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {}", what);
        sleep(Duration::from_millis(50));
    }
}

impl Cluster {
    /// Starts a coordinator and `workers` (name, devices such as "cuda:0") and waits until
    /// every worker is alive in the registry.
    pub fn start(workers: &[(&str, &[&str])]) -> Cluster {
        Cluster::start_with(workers, false)
    }

    /// As start; with `auth` the coordinator needs tokens (WORKER_TOKEN for the workers,
    /// TRAINER_TOKEN for clients).
    pub fn start_with(workers: &[(&str, &[&str])], auth: bool) -> Cluster {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "devcoord-rust-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir_all(&dir).unwrap();
        let addr = format!("tcp://127.0.0.1:{}", free_port());
        let mut cluster = Cluster {
            addr: addr.clone(),
            token: if auth { Some(TRAINER_TOKEN.to_string()) } else { None },
            dir: dir.clone(),
            children: Vec::new(),
        };
        let mut coordinator = format!(
            "listen: {}\nhttp: \"\"\nheartbeat:\n  interval_ms: 500\n  dead_after_ms: 5000\nlog:\n  level: info\n",
            addr
        );
        let mut worker_auth = String::new();
        if auth {
            let tokens = dir.join("tokens.yaml");
            fs::write(&tokens, format!("{}: worker\n{}: trainer\n", WORKER_TOKEN, TRAINER_TOKEN)).unwrap();
            coordinator += &format!("auth:\n  tokens_file: {}\n", tokens.display());
            let token_file = dir.join("worker.token");
            fs::write(&token_file, format!("{}\n", WORKER_TOKEN)).unwrap();
            worker_auth = format!("token_file: {}\n", token_file.display());
        }
        cluster.spawn("coordinator", &binary("DEVCOORD_SERVER", "server/coordinator/devcoord-server"), &coordinator);
        let client = Client::connect_with(
            &addr,
            &Options { timeout_ms: 2000, token: cluster.token.clone(), ..Options::default() },
        )
        .unwrap();
        wait_until("the coordinator to be ready", || client.cluster_status().ok().filter(|s| s.ready));
        for (name, devices) in workers {
            let listen = format!("tcp://127.0.0.1:{}", free_port());
            let mut cfg = format!(
                "name: {}\ncoordinator: {}\nlisten: {}\nadvertise: {}\n{}log:\n  level: info\ndevices:\n",
                name, addr, listen, listen, worker_auth
            );
            for d in devices.iter() {
                cfg += &format!("  - device: \"{}\"\n    memory: 8GiB\n", d);
            }
            cluster.spawn(name, &binary("DEVCOORD_WORKER", "server/worker/devcoord-worker"), &cfg);
        }
        wait_until("the workers to be alive", || {
            let ws = client.workers().ok()?;
            let alive = workers.iter().all(|(n, _)| ws.iter().any(|w| w.name == *n && w.state == "alive"));
            if alive {
                Some(())
            } else {
                None
            }
        });
        cluster
    }

    fn spawn(&mut self, name: &str, binary: &PathBuf, config: &str) {
        let path = self.dir.join(format!("{}.yaml", name));
        fs::write(&path, config).unwrap();
        let log = fs::File::create(self.dir.join(format!("{}.log", name))).unwrap();
        let child = Command::new(binary)
            .arg("--config")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {}", binary, e));
        self.children.push(child);
    }

    /// A client of this cluster.
    pub fn client(&self) -> Client {
        let opts = Options { timeout_ms: 20000, token: self.token.clone(), ..Options::default() };
        Client::connect_with(&self.addr, &opts).unwrap()
    }
}

#[repr(C)]
struct SockaddrIn {
    family: u16,
    port_be: u16,
    addr_be: u32,
    zero: [u8; 8],
}

extern "C" {
    fn socket(domain: i32, kind: i32, protocol: i32) -> i32;
    fn bind(fd: i32, addr: *const SockaddrIn, len: u32) -> i32;
    fn getsockname(fd: i32, addr: *mut SockaddrIn, len: *mut u32) -> i32;
    fn close(fd: i32) -> i32;
}

/// An address nothing listens on while this lives: a socket bound to the port without
/// listen(), so a connect there is refused and no other test's daemon can take the port
/// (a port merely free a moment ago was once taken by a worker, which answered).
pub struct DeadAddress {
    fd: i32,
    pub addr: String,
}

impl DeadAddress {
    pub fn new() -> DeadAddress {
        const AF_INET: i32 = 2;
        const SOCK_STREAM: i32 = 1;
        let size = std::mem::size_of::<SockaddrIn>() as u32;
        let mut sa = SockaddrIn { family: AF_INET as u16, port_be: 0, addr_be: 0x7f00_0001u32.to_be(), zero: [0; 8] };
        // SAFETY: plain socket calls on a socket this struct owns; sa outlives the calls.
        unsafe {
            let fd = socket(AF_INET, SOCK_STREAM, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let mut len = size;
            if bind(fd, &sa, size) != 0 || getsockname(fd, &mut sa, &mut len) != 0 {
                let e = std::io::Error::last_os_error();
                close(fd);
                panic!("bind 127.0.0.1:0: {}", e);
            }
            DeadAddress { fd, addr: format!("tcp://127.0.0.1:{}", u16::from_be(sa.port_be)) }
        }
    }
}

impl Drop for DeadAddress {
    fn drop(&mut self) {
        // SAFETY: fd is this struct's own socket, closed once.
        unsafe {
            close(self.fd);
        }
    }
}
