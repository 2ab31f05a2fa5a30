//! What a request head is answered with: the request line's checks, the
//! two pages served, and the answers of authentication.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// What a request is answered with.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: &'static str,
    pub(crate) body: String,
    /// Headers beyond the fixed ones (`Allow`, `WWW-Authenticate`, ...).
    pub(crate) extra: Vec<(&'static str, &'static str)>,
}

/// Produces the body of `GET /metrics`.
pub(crate) type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A request line that passed the checks.
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
}

pub(crate) fn plain(status: u16, body: &str) -> Answer {
    let mut extra = Vec::new();
    if status == 405 {
        extra.push(("Allow", "GET"));
    }
    Answer {
        status,
        content_type: "text/plain; charset=utf-8",
        body: body.to_owned(),
        extra,
    }
}

/// 401 with the challenge that makes clients send their password.
pub(crate) fn unauthorized() -> Answer {
    let mut a = plain(401, "Unauthorized\n");
    a.extra.push(("WWW-Authenticate", "Basic"));
    a
}

/// 503: the password could not be checked in time (too many checks queued).
pub(crate) fn busy() -> Answer {
    let mut a = plain(503, "too many password checks in progress; retry\n");
    a.extra.push(("Retry-After", "1"));
    a
}

/// What a plain-HTTP client gets from a TLS port (Go's server says the same).
pub(crate) fn http_to_https() -> Answer {
    plain(400, "Client sent an HTTP request to an HTTPS server.\n")
}

pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// The request line's method and path (query and fragment cut), or the
/// 400 it earns.
pub(crate) fn parse(head: &str) -> Result<Request<'_>, Answer> {
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(plain(400, "malformed request line\n"));
    };
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return Err(plain(400, "malformed request line\n"));
    }
    let path = target.split(['?', '#']).next().unwrap_or("");
    Ok(Request { method, path })
}

/// The value of header `name` (case-insensitive), the first if repeated.
pub(crate) fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

const INDEX: &str = "<!DOCTYPE html>\n<html><head><title>memprobe exporter</title></head>\
<body><h1>memprobe exporter</h1><p><a href=\"/metrics\">/metrics</a></p></body></html>\n";

pub(crate) fn route(req: &Request<'_>, render: &Render) -> Answer {
    if req.path != "/metrics" && req.path != "/" {
        return plain(404, "not found: memprobe serves /metrics\n");
    }
    if req.method != "GET" {
        return plain(405, "only GET is allowed\n");
    }
    if req.path == "/" {
        return Answer {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body: INDEX.to_owned(),
            extra: Vec::new(),
        };
    }
    // One thread serves every connection: a panic while reading a source
    // must cost this scrape (500), not the server.
    match catch_unwind(AssertUnwindSafe(|| render())) {
        Ok(body) => Answer {
            status: 200,
            content_type: crate::text::CONTENT_TYPE,
            body,
            extra: Vec::new(),
        },
        Err(_) => plain(500, "rendering the metrics failed\n"),
    }
}

/// The bytes of `answer`, with the configured `headers` added.
pub(crate) fn bytes(answer: &Answer, headers: &[(&'static str, String)]) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
        answer.status,
        reason(answer.status),
        answer.content_type,
        answer.body.len()
    );
    for (k, v) in &answer.extra {
        head += &format!("{k}: {v}\r\n");
    }
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += "Connection: close\r\n\r\n";
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(answer.body.as_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_found_case_insensitively_and_the_request_line_checked() {
        let head = "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nauthorization:  Basic eA== \r\n";
        assert_eq!(header(head, "Authorization"), Some("Basic eA=="));
        assert_eq!(header(head, "cookie"), None);
        let r = parse(head).ok().unwrap();
        assert_eq!((r.method, r.path), ("GET", "/metrics"));
        assert_eq!(parse("GET /metrics\r\n").err().unwrap().status, 400);
        assert_eq!(parse("GET / HTTP/2\r\n").err().unwrap().status, 400);
    }

    #[test]
    fn an_answer_carries_its_extra_and_configured_headers() {
        let b = bytes(&unauthorized(), &[("X-Frame-Options", "deny".into())]);
        let t = String::from_utf8(b).unwrap();
        assert!(t.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{t}");
        assert!(t.contains("\r\nWWW-Authenticate: Basic\r\n"), "{t}");
        assert!(t.contains("\r\nX-Frame-Options: deny\r\n"), "{t}");
        assert!(t.ends_with("\r\n\r\nUnauthorized\n"), "{t}");
    }
}
