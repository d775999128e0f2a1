//! `fencegate demo`, the README's first command: the real binary as a child on
//! free ports. It must play its story through the real proxy (holder 33's
//! write and holder 34's land, holder 33's late write is refused and never
//! reaches the store), then keep serving the reader's own requests, and stop
//! cleanly on Ctrl-C.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fencegate");
/// Generous: a loaded CI machine may take a while to start a process.
const DEADLINE: Duration = Duration::from_secs(30);
const FREE: [&str; 6] = ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--store-listen", "127.0.0.1:0"];

/// The demo as a child, killed when the test ends however it ends.
struct Demo {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Demo {
    fn start(args: &[&str]) -> Demo {
        let mut child = Command::new(BIN)
            .arg("demo")
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the fencegate binary starts");
        let stdout: ChildStdout = child.stdout.take().expect("stdout is piped");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Demo { child, lines, seen: Vec::new() }
    }

    /// The next line the demo prints.
    fn line(&mut self) -> String {
        match self.lines.recv_timeout(DEADLINE) {
            Ok(line) => {
                self.seen.push(line.clone());
                line
            }
            Err(e) => panic!("no line from the demo within {DEADLINE:?} ({e}); it printed:\n{}", self.seen.join("\n")),
        }
    }

    /// Lines up to and including the first that contains `marker`.
    fn lines_until(&mut self, marker: &str) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            let line = self.line();
            let done = line.contains(marker);
            lines.push(line);
            if done {
                return lines;
            }
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address after `http://` on the line that starts with `label`.
fn address(lines: &[String], label: &str) -> SocketAddr {
    let line = lines.iter().find(|l| l.trim_start().starts_with(label) && l.contains("http://"));
    let line = line.unwrap_or_else(|| panic!("no {label} line in {lines:?}"));
    let (_, rest) = line.split_once("http://").unwrap_or_else(|| panic!("no address on {line:?}"));
    let addr = rest.split_whitespace().next().unwrap_or_default();
    addr.parse().unwrap_or_else(|e| panic!("{addr:?} on {line:?}: {e}"))
}

/// One HTTP/1.1 request on a connection of its own: the status and the body.
fn request(addr: SocketAddr, method: &str, path: &str, token: Option<u64>, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("the demo serves");
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let token = token.map(|t| format!("X-Fencing-Token: {t}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{token}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    let status = status.unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// The `text` block that follows the README's `cargo run --release -- demo`,
/// up to its `...`.
fn readme_demo_output() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let (_, after) = readme.split_once("cargo run --release -- demo\n").expect("the README runs the demo");
    let (_, block) = after.split_once("```text\n").expect("the README shows the demo's output");
    block.lines().take_while(|l| *l != "...").map(str::to_string).collect()
}

#[test]
fn the_demo_plays_its_story_then_serves_the_readers_requests() {
    let mut demo = Demo::start(&FREE);
    let story = demo.lines_until("fencegate keeps serving until Ctrl-C");
    let proxy = address(&story, "fencegate ");
    let store = address(&story, "store ");
    let admin = address(&story, "admin ");
    assert_ne!(proxy.port(), 0, "the printed address is the bound one");

    // Each write's answer, in order: the two holders' writes land, the late one is refused.
    let answers: Vec<&String> = story.iter().filter(|l| l.contains("client <- ")).collect();
    let statuses: Vec<&str> = answers.iter().filter_map(|l| l.split("client <- ").nth(1)?.split(' ').next()).collect();
    assert_eq!(statuses, ["200", "200", "409"], "the story's answers:\n{}", story.join("\n"));
    assert!(answers[2].contains("stale-token"), "{}", answers[2]);

    // The store saw the two writes that landed and nothing of the late one.
    let reached: Vec<&String> = story.iter().filter(|l| l.contains("store  <- ")).collect();
    assert_eq!(reached.len(), 2, "requests that reached the store:\n{}", story.join("\n"));
    assert!(reached[0].contains("X-Fencing-Token: 33") && reached[1].contains("X-Fencing-Token: 34"), "{reached:?}");
    let late = story.iter().position(|l| l == answers[2]).unwrap();
    assert_eq!(story[late + 1].trim(), "store  received nothing");
    assert!(
        story.iter().any(|l| l.trim() == "/objects/report.txt = \"v2 from holder 34\""),
        "the store is unchanged by the late write:\n{}",
        story.join("\n")
    );

    // The README shows this output as the reader's first command prints it.
    let defaults = [(proxy, "127.0.0.1:8080"), (admin, "127.0.0.1:9901"), (store, "127.0.0.1:9000")];
    let printed: Vec<String> = story
        .iter()
        .map(|l| defaults.iter().fold(l.clone(), |l, (bound, default)| l.replace(&bound.to_string(), default)))
        .collect();
    let readme = readme_demo_output();
    assert_eq!(readme, printed, "README.md's demo output is not what the demo prints");

    // The commands it prints name the bound addresses.
    let commands = demo.lines_until("/fences?key=");
    assert!(commands.iter().any(|l| l.contains(&format!("http://{proxy}/objects/report.txt"))), "{commands:?}");
    assert!(commands.iter().any(|l| l.contains(&format!("http://{admin}/fences"))), "{commands:?}");

    // It keeps serving: the reader's own requests go through the fence.
    let object = "/objects/report.txt";
    assert_eq!(request(proxy, "GET", object, None, "").1, "v2 from holder 34");
    assert_eq!(request(proxy, "PUT", object, Some(35), "v3 from holder 35").0, 200);
    loop {
        let line = demo.line();
        if line.contains("store  <- PUT") {
            assert!(line.contains("X-Fencing-Token: 35"), "{line}");
            break;
        }
    }
    let (status, body) = request(proxy, "PUT", object, Some(34), "late write from holder 34");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("urn:fencegate:problem:stale-token"), "{body}");
    assert_eq!(request(proxy, "PUT", object, None, "no token").0, 428);
    // Read from the store itself: the refused writes never reached it.
    assert_eq!(request(store, "GET", object, None, ""), (200, "v3 from holder 35".to_string()));
    let (status, fence) = request(admin, "GET", "/fences?key=%2Fobjects%2Freport.txt", None, "");
    assert_eq!((status, fence.as_str()), (200, r#"{"key":"/objects/report.txt","token":35}"#));

    // Ctrl-C ends it cleanly.
    let pid = demo.child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let started = Instant::now();
    loop {
        if let Some(status) = demo.child.try_wait().unwrap() {
            assert!(status.success(), "the demo exits 0 on SIGINT: {status}");
            break;
        }
        assert!(started.elapsed() < DEADLINE, "the demo did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_port_in_use_is_named_with_the_flag_that_moves_it() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    // Within a deadline: a demo that did start would serve until stopped.
    let out = crate::common::process::run_to_exit(
        Command::new(BIN)
            .args(["demo", "--listen", &addr, "--admin-listen", "127.0.0.1:0", "--store-listen", "127.0.0.1:0"])
            .env_remove("RUST_LOG"),
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&addr) && stderr.contains("--listen"), "{stderr}");
}

/// The demo's admin token is printed for all to read: its admin listener
/// is refused anywhere but on loopback, before anything listens.
#[test]
fn the_demo_keeps_its_admin_listener_on_loopback() {
    let out = crate::common::process::run_to_exit(
        Command::new(BIN)
            .args(["demo", "--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0", "--store-listen", "127.0.0.1:0"])
            .env_remove("RUST_LOG"),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--admin-listen 0.0.0.0:0") && stderr.contains("loopback"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).is_empty(),
        "the demo started: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}
