//! Root reaches another user's process by pid: the server (a child running as uid 65534)
//! listens on its default path, `/tmp/podq-65534/<pid>.sock`, and
//! `Client::connect_to_pid` finds it there and accepts it only after checking its
//! directory, its socket and the listener's credentials against that uid.

use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use podq::control::{Client, Request};

#[test]
#[ignore = "helper: run by root_reaches_a_users_process as uid 65534"]
fn users_process_child() {
    let wq = podq::Workqueue::builder("users_queue").build().unwrap();
    wq.expose().unwrap();
    let server = podq::control::start().unwrap();
    println!("READY {}", server.path().display());
    // Until the parent closes our stdin.
    let _ = std::io::stdin().read_line(&mut String::new());
    drop(server);
}

#[test]
fn root_reaches_a_users_process() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("NOT RUN: root_reaches_a_users_process needs root to start a child as uid 65534");
        return;
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "users_process_child", "--ignored", "--nocapture"])
        .env_remove("XDG_RUNTIME_DIR")
        .current_dir("/")
        .uid(65534)
        .gid(65534)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let path = lines
        .find_map(|l| l.unwrap().strip_prefix("READY ").map(str::to_owned))
        .expect("the child started its server");
    assert_eq!(path, format!("/tmp/podq-65534/{pid}.sock"));
    let mut client = Client::connect_to_pid(pid, Duration::from_secs(10)).unwrap();
    assert_eq!(client.path().display().to_string(), path);
    assert_eq!(client.server().pid as u32, pid);
    assert_eq!(client.server().uid, 65534);
    let list = client.call(&Request::List).unwrap().queues.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name, "users_queue");
    drop(client);
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert!(
        !std::path::Path::new(&path).exists(),
        "the socket is removed"
    );
}
