//! fleet's own HTTP/1.1 for generation requests to a plain-HTTP server: one write per request,
//! the answer read and de-chunked on the request's own task, and kept-alive connections pooled
//! per server.
//!
//! A generation request is fleet's hot path: a job against fast servers sends thousands a
//! second. Through reqwest each one crossed a stack built for every case (URL parsing, tower's
//! redirect, retry and timeout layers, hyper's connection task, which the request reaches and
//! hears back from over channels), which cost about four times the CPU of the HTTP work itself
//! (docs/benchmarks.md, the client's profile). This module does only what a generation needs:
//! `POST` a JSON body, read the status, the headers and a body framed by `Content-Length`,
//! chunked transfer coding or the connection's end. Probes (`/health`, `/server_info`,
//! `/metrics`) still go through reqwest.
//!
//! It is used only where it changes nothing the user sees: a plain `http://` URL with no user
//! info, query or fragment, a valid API key, and no HTTP proxy in the environment (reqwest would
//! send through it; fleet then keeps using reqwest). Errors map to the same [`ClientError`]s as
//! reqwest's, with the same timeouts (`HttpOptions`) and the same idle limit on pooled
//! connections, so retries, redispatch and taking a server out decide exactly as before.

use std::io;
use std::ops::Range;
use std::sync::Mutex;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::client::{ClientError, Endpoint, HttpOptions, POOL_IDLE};

/// Idle connections kept per server, as reqwest's `pool_max_idle_per_host`.
const MAX_IDLE: usize = 2048;
/// A connection's read buffer: an instant answer, head and body, fits in one read.
const READ_BUF: usize = 16 * 1024;
/// Larger response heads are refused (hyper's default limit is about as large).
const MAX_HEAD: usize = 64 * 1024;
/// A chunk-size or trailer line longer than this is not HTTP.
const MAX_LINE: usize = 4096;

/// The variables through which reqwest would route plain-HTTP requests via a proxy.
const PROXY_VARS: [&str; 4] = ["ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"];

/// One server's generation requests: where to connect, the request head's fixed part, and the
/// idle connections.
#[derive(Debug)]
pub struct Wire {
    /// `host:port`, for connecting.
    connect_to: String,
    /// The fixed part of every request head after the method and target: `Host`, the JSON
    /// content type, `Accept` and the API key.
    head: String,
    /// The base URL's path (empty, or `/prefix` without a trailing slash).
    prefix: String,
    opts: HttpOptions,
    /// Most recently used last.
    idle: Mutex<Vec<(Conn, Instant)>>,
}

impl Wire {
    /// The wire for `endpoint`, or `None` where it would not send what reqwest sends (see the
    /// module's doc): reqwest then carries the generation requests too.
    pub fn new(endpoint: &Endpoint, opts: HttpOptions) -> Option<Wire> {
        if PROXY_VARS
            .iter()
            .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
        {
            return None;
        }
        Wire::direct(endpoint, opts)
    }

    /// [`Wire::new`] for a server reached directly.
    fn direct(endpoint: &Endpoint, opts: HttpOptions) -> Option<Wire> {
        let url = reqwest::Url::parse(&endpoint.base_url).ok()?;
        if url.scheme() != "http"
            || !url.username().is_empty()
            || url.password().is_some()
            || url.query().is_some()
            || url.fragment().is_some()
        {
            return None;
        }
        let host = url.host_str()?;
        let port = url.port_or_known_default()?;
        // As reqwest writes it: the port only when it is not the scheme's default.
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        let mut head =
            format!("host: {authority}\r\ncontent-type: application/json\r\naccept: */*\r\n");
        if let Some(key) = &endpoint.api_key {
            // reqwest refuses a header value with control characters; so does its path.
            if !key
                .bytes()
                .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
            {
                return None;
            }
            head.push_str(&format!("authorization: Bearer {key}\r\n"));
        }
        Some(Wire {
            connect_to: format!("{host}:{port}"),
            head,
            prefix: url.path().trim_end_matches('/').to_string(),
            opts,
            idle: Mutex::new(Vec::new()),
        })
    }

    pub fn request_timeout(&self) -> std::time::Duration {
        self.opts.request_timeout
    }

    /// Sends `POST path` with a JSON `body` and reads the answer's head. A pooled connection
    /// that the server closed meanwhile fails before any of the answer arrives: the request
    /// then goes once more, on a new connection (as hyper's pool retries a request whose
    /// connection closed under it).
    pub async fn post(&self, path: &str, body: &[u8]) -> Result<Response<'_>, WireError> {
        let mut msg = Vec::with_capacity(body.len() + self.head.len() + path.len() + 64);
        msg.extend_from_slice(b"POST ");
        msg.extend_from_slice(self.prefix.as_bytes());
        msg.extend_from_slice(path.as_bytes());
        msg.extend_from_slice(b" HTTP/1.1\r\n");
        msg.extend_from_slice(self.head.as_bytes());
        msg.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        msg.extend_from_slice(body);
        if let Some(conn) = self.take_idle() {
            match self.exchange(conn, &msg).await {
                Err(Failed::Stale) => {}
                Err(Failed::Wire(e)) => return Err(e),
                Ok(r) => return Ok(r),
            }
        }
        let conn = self.connect().await?;
        match self.exchange(conn, &msg).await {
            Ok(r) => Ok(r),
            Err(Failed::Wire(e)) => Err(e),
            Err(Failed::Stale) => Err(WireError::Closed),
        }
    }

    /// The most recently used idle connection that is still open; older ones than
    /// [`POOL_IDLE`] are closed (the server is about to).
    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() >= POOL_IDLE {
                // Every one below it has waited longer.
                idle.clear();
                return None;
            }
            if conn.open() {
                return Some(conn);
            }
        }
        None
    }

    fn put_idle(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((conn, Instant::now()));
        }
    }

    async fn connect(&self) -> Result<Conn, WireError> {
        let connecting = TcpStream::connect(self.connect_to.as_str());
        let io = match tokio::time::timeout(self.opts.connect_timeout, connecting).await {
            Ok(Ok(io)) => io,
            Ok(Err(e)) => return Err(WireError::Connect(e)),
            Err(_) => return Err(WireError::ConnectTimeout),
        };
        // As reqwest's client is built (`tcp_nodelay`): a request is one write, sent at once.
        let _ = io.set_nodelay(true);
        Ok(Conn {
            io,
            buf: vec![0; READ_BUF],
            start: 0,
            end: 0,
            used: false,
        })
    }

    /// Writes the request and reads the answer's head. `Stale`: a reused connection closed
    /// before any byte of the answer came.
    async fn exchange(&self, mut conn: Conn, msg: &[u8]) -> Result<Response<'_>, Failed> {
        let reused = conn.used;
        let stale = |e: WireError| {
            if reused && conn_gone(&e) {
                Failed::Stale
            } else {
                Failed::Wire(e)
            }
        };
        conn.used = true;
        if let Err(e) = conn.io.write_all(msg).await {
            return Err(stale(WireError::Io(e)));
        }
        // Nothing of the answer has come yet.
        let mut first = true;
        loop {
            match conn.head() {
                Ok(Some(head)) if (100..200).contains(&head.status) => {
                    // An interim answer (100 Continue, 103 Early Hints): the real one follows.
                    continue;
                }
                Ok(Some(head)) => {
                    return Ok(Response {
                        status: head.status,
                        framing: head.framing,
                        keep_alive: head.keep_alive,
                        conn: Some(conn),
                        wire: self,
                    });
                }
                Ok(None) => {}
                Err(e) => return Err(Failed::Wire(e)),
            }
            match conn.fill().await {
                Ok(0) if first => return Err(stale(WireError::Closed)),
                Ok(0) => return Err(Failed::Wire(WireError::Closed)),
                Ok(_) => first = false,
                Err(e) if first => return Err(stale(WireError::Io(e))),
                Err(e) => return Err(Failed::Wire(WireError::Io(e))),
            }
        }
    }
}

/// Whether an error says the connection was closed under the request.
fn conn_gone(e: &WireError) -> bool {
    match e {
        WireError::Closed => true,
        WireError::Io(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

enum Failed {
    Stale,
    Wire(WireError),
}

/// Why a request on the wire failed.
#[derive(Debug)]
pub enum WireError {
    Connect(io::Error),
    ConnectTimeout,
    Io(io::Error),
    /// The server closed the connection before the answer was complete.
    Closed,
    /// What came back is not HTTP/1.x.
    Malformed(String),
}

impl WireError {
    /// The error reqwest's path would give: a connection that could not be made is
    /// [`ClientError::Connect`] (or [`ClientError::OutOfFiles`] when fleet's descriptors ran
    /// out), one that broke is [`ClientError::Transport`].
    pub fn into_client(self, url: &str) -> ClientError {
        let url = url.to_string();
        match self {
            WireError::Connect(e) => {
                let reason = e.to_string();
                if e.raw_os_error()
                    .is_some_and(|c| c == libc::EMFILE || c == libc::ENFILE)
                {
                    ClientError::OutOfFiles { url, reason }
                } else {
                    ClientError::Connect { url, reason }
                }
            }
            WireError::ConnectTimeout => ClientError::Timeout { url },
            WireError::Io(e) => ClientError::Transport {
                url,
                reason: e.to_string(),
            },
            WireError::Closed => ClientError::Transport {
                url,
                reason: "connection closed before message completed".into(),
            },
            WireError::Malformed(reason) => ClientError::Transport { url, reason },
        }
    }
}

/// How the answer's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked(Chunk),
    /// At the connection's end (no length, not chunked).
    Eof,
    Done,
}

/// Where a chunked body's reader stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailers,
}

struct Head {
    status: u16,
    framing: Framing,
    keep_alive: bool,
}

/// One TCP connection and what has been read from it but not yet taken.
#[derive(Debug)]
struct Conn {
    io: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    used: bool,
}

impl Conn {
    /// Still open, with nothing unread: a read that would block, not the end of the stream.
    fn open(&self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.io.try_read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Reads more into the buffer; 0 at the end of the stream.
    async fn fill(&mut self) -> io::Result<usize> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                self.buf.resize(self.buf.len() * 2, 0);
            }
        }
        let n = self.io.read(&mut self.buf[self.end..]).await?;
        self.end += n;
        Ok(n)
    }

    fn unread(&self) -> usize {
        self.end - self.start
    }

    /// Takes up to `n` unread bytes into `out`; returns how many.
    fn take(&mut self, n: u64, out: &mut Vec<u8>) -> u64 {
        let k = (self.unread() as u64).min(n) as usize;
        out.extend_from_slice(&self.buf[self.start..self.start + k]);
        self.start += k;
        k as u64
    }

    /// The next whole line (without its CRLF or LF), taken; `None` until one has arrived.
    fn line(&mut self) -> Result<Option<Range<usize>>, WireError> {
        let unread = &self.buf[self.start..self.end];
        let Some(nl) = unread.iter().position(|&b| b == b'\n') else {
            if unread.len() > MAX_LINE {
                return Err(WireError::Malformed(
                    "a chunked body's line is too long".into(),
                ));
            }
            return Ok(None);
        };
        let from = self.start;
        let mut to = from + nl;
        if to > from && self.buf[to - 1] == b'\r' {
            to -= 1;
        }
        self.start += nl + 1;
        Ok(Some(from..to))
    }

    /// Parses the answer's head once it has all arrived, and takes it.
    fn head(&mut self) -> Result<Option<Head>, WireError> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let len = match resp.parse(&self.buf[self.start..self.end]) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if self.unread() > MAX_HEAD => {
                return Err(WireError::Malformed(
                    "the response head is too large".into(),
                ));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(WireError::Malformed(format!("invalid HTTP response: {e}"))),
        };
        let status = resp.code.unwrap_or(0);
        let http11 = resp.version == Some(1);
        let mut chunked = false;
        let mut length: Option<u64> = None;
        let mut close = !http11;
        for h in resp.headers.iter() {
            let value = std::str::from_utf8(h.value).unwrap_or_default();
            if h.name.eq_ignore_ascii_case("transfer-encoding") {
                // Chunked only when it is the last coding applied (RFC 9112 §6.3).
                chunked = value
                    .rsplit(',')
                    .next()
                    .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"));
            } else if h.name.eq_ignore_ascii_case("content-length") {
                let n: u64 = value.trim().parse().map_err(|_| {
                    WireError::Malformed(format!("invalid content-length {value:?}"))
                })?;
                if length.is_some_and(|l| l != n) {
                    return Err(WireError::Malformed("conflicting content-length".into()));
                }
                length = Some(n);
            } else if h.name.eq_ignore_ascii_case("connection") {
                for token in value.split(',').map(str::trim) {
                    if token.eq_ignore_ascii_case("close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case("keep-alive") && !http11 {
                        close = false;
                    }
                }
            }
        }
        if status == 101 {
            return Err(WireError::Malformed(
                "the server switched protocols on a generation request".into(),
            ));
        }
        let framing = if status == 204 || status == 304 || (100..200).contains(&status) {
            Framing::Done
        } else if chunked {
            Framing::Chunked(Chunk::Size)
        } else if let Some(n) = length {
            Framing::Length(n)
        } else {
            close = true;
            Framing::Eof
        };
        self.start += len;
        Ok(Some(Head {
            status,
            framing,
            keep_alive: !close,
        }))
    }
}

/// An answer whose head has been read; its body is read with [`Response::read`]. Read to its
/// end, its connection goes back to the pool; dropped before, the connection is closed.
#[derive(Debug)]
pub struct Response<'w> {
    pub status: u16,
    framing: Framing,
    keep_alive: bool,
    conn: Option<Conn>,
    wire: &'w Wire,
}

impl Response<'_> {
    /// Appends the next part of the body that has arrived to `out`; `false` at the body's end.
    pub async fn read(&mut self, out: &mut Vec<u8>) -> Result<bool, WireError> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Ok(false);
            };
            let need_more = match &mut self.framing {
                Framing::Done => {
                    let conn = self.conn.take().expect("checked above");
                    // Whatever follows the body would be an answer nobody asked for.
                    if self.keep_alive && conn.unread() == 0 {
                        self.wire.put_idle(conn);
                    }
                    return Ok(false);
                }
                Framing::Length(left) => {
                    if *left == 0 {
                        self.framing = Framing::Done;
                        continue;
                    }
                    if conn.unread() > 0 {
                        *left -= conn.take(*left, out);
                        if *left == 0 {
                            self.framing = Framing::Done;
                        }
                        return Ok(true);
                    }
                    true
                }
                Framing::Eof => {
                    if conn.unread() > 0 {
                        conn.take(u64::MAX, out);
                        return Ok(true);
                    }
                    match conn.fill().await {
                        Ok(0) => {
                            self.framing = Framing::Done;
                            self.keep_alive = false;
                            continue;
                        }
                        Ok(_) => continue,
                        Err(e) => return Err(WireError::Io(e)),
                    }
                }
                Framing::Chunked(state) => match state {
                    Chunk::Size => match conn.line()? {
                        Some(r) => {
                            let line = &conn.buf[r];
                            let digits = line.split(|&b| b == b';').next().unwrap_or_default();
                            let size = std::str::from_utf8(digits)
                                .ok()
                                .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
                                .ok_or_else(|| WireError::Malformed("invalid chunk size".into()))?;
                            *state = if size == 0 {
                                Chunk::Trailers
                            } else {
                                Chunk::Data(size)
                            };
                            continue;
                        }
                        None => true,
                    },
                    Chunk::Data(left) => {
                        if conn.unread() > 0 {
                            *left -= conn.take(*left, out);
                            if *left == 0 {
                                *state = Chunk::DataEnd;
                            }
                            return Ok(true);
                        }
                        true
                    }
                    Chunk::DataEnd => match conn.line()? {
                        Some(r) if r.is_empty() => {
                            *state = Chunk::Size;
                            continue;
                        }
                        Some(_) => {
                            return Err(WireError::Malformed(
                                "a chunk's data is longer than its size".into(),
                            ));
                        }
                        None => true,
                    },
                    Chunk::Trailers => match conn.line()? {
                        Some(r) if r.is_empty() => {
                            self.framing = Framing::Done;
                            continue;
                        }
                        Some(_) => continue,
                        None => true,
                    },
                },
            };
            if need_more {
                match conn.fill().await {
                    Ok(0) => return Err(WireError::Closed),
                    Ok(_) => {}
                    Err(e) => return Err(WireError::Io(e)),
                }
            }
        }
    }

    /// The whole (rest of the) body.
    pub async fn read_to_end(&mut self, out: &mut Vec<u8>) -> Result<(), WireError> {
        while self.read(out).await? {}
        Ok(())
    }
}

/// A generation request's answer, its head read: from reqwest, or from fleet's own connection.
pub enum Answer<'a> {
    Reqwest(reqwest::Response),
    Wire(Response<'a>),
}

impl Answer<'_> {
    pub fn status(&self) -> u16 {
        match self {
            Answer::Reqwest(r) => r.status().as_u16(),
            Answer::Wire(r) => r.status,
        }
    }

    /// Appends the next piece of the body that has arrived to `out`; `false` at its end.
    pub async fn chunk(&mut self, out: &mut Vec<u8>, url: &str) -> Result<bool, ClientError> {
        match self {
            Answer::Reqwest(r) => match r.chunk().await {
                Ok(Some(b)) => {
                    out.extend_from_slice(&b);
                    Ok(true)
                }
                Ok(None) => Ok(false),
                Err(e) => Err(ClientError::from_reqwest(url, e)),
            },
            Answer::Wire(r) => r.read(out).await.map_err(|e| e.into_client(url)),
        }
    }

    /// The whole body.
    pub async fn bytes(self, url: &str) -> Result<bytes::Bytes, ClientError> {
        match self {
            Answer::Reqwest(r) => r
                .bytes()
                .await
                .map_err(|e| ClientError::from_reqwest(url, e)),
            Answer::Wire(mut r) => {
                let mut out = Vec::new();
                r.read_to_end(&mut out)
                    .await
                    .map_err(|e| e.into_client(url))?;
                Ok(out.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// A server that answers each request it reads with the next of `answers`, as raw bytes,
    /// written in the given pieces; after the last it closes the connection. Returns its URL
    /// and the requests it read.
    async fn serve(
        answers: Vec<Vec<&'static [u8]>>,
    ) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for pieces in answers {
                let mut req = Vec::new();
                let mut b = [0u8; 4096];
                // Read one whole request: its head, then content-length bytes.
                loop {
                    let n = s.read(&mut b).await.unwrap();
                    req.extend_from_slice(&b[..n]);
                    let text = String::from_utf8_lossy(&req).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len: usize = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .map_or(0, |v| v.parse().unwrap());
                        if req.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                seen.push(String::from_utf8(req).unwrap());
                for p in pieces {
                    s.write_all(p).await.unwrap();
                    s.flush().await.unwrap();
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
            seen
        });
        (url, task)
    }

    fn wire(url: &str, key: Option<&str>) -> Wire {
        let mut e = Endpoint::from_url(url);
        e.api_key = key.map(str::to_string);
        Wire::direct(&e, HttpOptions::default()).unwrap()
    }

    async fn body(w: &Wire) -> (u16, String) {
        let mut r = w.post("/generate", b"{\"text\":\"hi\"}").await.unwrap();
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        (r.status, String::from_utf8(out).unwrap())
    }

    #[tokio::test]
    async fn chunked_length_and_eof_bodies_in_pieces_reuse_the_connection() {
        let (url, server) = serve(vec![
            vec![
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
                b"6\r\ndata: \r\n",
                b"3;ext=1\r\nabc\r",
                b"\n",
                b"0\r\ntrailer: x\r\n\r\n",
            ],
            vec![b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel", b"lo"],
            vec![b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\nbusy"],
        ])
        .await;
        let w = wire(&url, Some("k3y"));
        assert_eq!(body(&w).await, (200, "data: abc".into()));
        assert_eq!(w.idle.lock().unwrap().len(), 1, "kept alive");
        assert_eq!(body(&w).await, (200, "hello".into()));
        assert_eq!(body(&w).await, (503, "busy".into()));
        assert!(w.idle.lock().unwrap().is_empty(), "closed by the server");
        let seen = server.await.unwrap();
        assert_eq!(seen.len(), 3, "one connection carried all three");
        assert!(seen[0].starts_with("POST /generate HTTP/1.1\r\nhost: 127.0.0.1:"));
        assert!(seen[0].contains("\r\nauthorization: Bearer k3y\r\n"));
        assert!(seen[0].contains("\r\ncontent-type: application/json\r\n"));
        assert!(seen[0].ends_with("\r\ncontent-length: 13\r\n\r\n{\"text\":\"hi\"}"));
    }

    #[tokio::test]
    async fn a_pooled_connection_the_server_closed_is_replaced() {
        let (url, server) = serve(vec![vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        ]])
        .await;
        let w = wire(&url, None);
        assert_eq!(body(&w).await, (200, "ok".into()));
        server.await.unwrap();
        // The server closed that connection; the next request gets refused on a new one,
        // not a stale-connection error.
        let e = w.post("/generate", b"{}").await.unwrap_err();
        assert!(matches!(e, WireError::Connect(_)), "{e:?}");
        let e = e.into_client("u");
        assert!(e.is_unreachable() && e.is_retryable(), "{e}");
    }

    #[tokio::test]
    async fn an_answer_cut_off_is_a_transport_error() {
        let (url, _server) = serve(vec![vec![
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab",
        ]])
        .await;
        let w = wire(&url, None);
        let mut r = w.post("/generate", b"{}").await.unwrap();
        let mut out = Vec::new();
        let e = r.read_to_end(&mut out).await.unwrap_err();
        assert!(matches!(e, WireError::Closed), "{e:?}");
        assert_eq!(out, b"ab");
        let e = e.into_client("u");
        assert!(matches!(e, ClientError::Transport { .. }) && e.is_unreachable());
    }

    #[tokio::test]
    async fn garbage_is_malformed() {
        let (url, _server) = serve(vec![vec![b"SSH-2.0-OpenSSH\r\n\r\n"]]).await;
        let w = wire(&url, None);
        let e = w.post("/generate", b"{}").await.unwrap_err();
        assert!(matches!(e, WireError::Malformed(_)), "{e:?}");
    }

    #[test]
    fn only_plain_direct_http_goes_on_the_wire() {
        let ok = |u: &str| Wire::direct(&Endpoint::from_url(u), HttpOptions::default()).is_some();
        assert!(ok("http://127.0.0.1:30000"));
        assert!(ok("http://[::1]:30000/prefix/"));
        assert!(!ok("https://h:443"));
        assert!(!ok("http://user:pw@h:1"));
        let w = Wire::direct(
            &Endpoint::from_url("http://h:80/p/"),
            HttpOptions::default(),
        )
        .unwrap();
        assert_eq!((w.connect_to.as_str(), w.prefix.as_str()), ("h:80", "/p"));
        assert!(w.head.starts_with("host: h\r\n"), "{}", w.head);
        let v6 = Wire::direct(
            &Endpoint::from_url("http://[::1]:9/"),
            HttpOptions::default(),
        );
        assert_eq!(v6.unwrap().connect_to, "[::1]:9");
        let mut e = Endpoint::from_url("http://h:1");
        e.api_key = Some("bad\r\nkey".into());
        assert!(Wire::direct(&e, HttpOptions::default()).is_none());
    }
}
