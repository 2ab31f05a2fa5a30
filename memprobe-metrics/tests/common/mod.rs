//! Helpers shared by the exporter's tests.
#![allow(dead_code, unreachable_pub)]

#[path = "../../../tests/src/required_tool.rs"]
pub mod required_tool;

pub mod local;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Sends `request` raw and returns (status, body).
pub fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).expect("send");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    parse(&text)
}

/// (status, body) of a raw answer.
pub fn parse(text: &str) -> (u16, String) {
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

/// `GET path` and (status, body).
pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
}

/// The value of the first sample whose line starts with `prefix`.
pub fn value(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
