//! Helpers of the binary's tests.
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};

use cgloop_int_collector::gen::{GenConfig, Generator};

pub const BIN: &str = env!("CARGO_BIN_EXE_cgloop-int-collector");

/// Starts `run` with `args`; returns the child and its readiness line (`{"event": "listening"…}`).
pub fn start(args: &[&str]) -> (Child, serde_json::Value) {
    let mut child = Command::new(BIN)
        .arg("run")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let listening = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    std::thread::spawn(move || stderr.lines().for_each(drop)); // keep the pipe open and drained
    (child, listening)
}

/// Sends `n` generated reports to `to` from a loopback socket.
pub fn send_reports(to: SocketAddr, n: usize) -> UdpSocket {
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut gen = Generator::new(GenConfig::default());
    let mut buf = Vec::new();
    for _ in 0..n {
        gen.next_packet(&mut buf);
        sender.send_to(&buf, to).unwrap();
    }
    sender
}
