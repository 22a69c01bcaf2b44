//! An S3-compatible server for tests and benchmarks: moto's, run from a
//! Python that has it (`SB_PYTHON`, else `python3`; `.ci/run` installs it)
//! on a free port of 127.0.0.1, and the environment that points the
//! object store client at it; and proxies in front of it that throttle or
//! fail requests as a rule says.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// moto's S3 server, stopped when dropped.
pub struct S3Server {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl S3Server {
    /// Starts one; `None` when no Python here has moto's server.
    pub fn start() -> Option<Self> {
        let python = std::env::var("SB_PYTHON").unwrap_or_else(|_| "python3".into());
        let found = Command::new(&python)
            .args(["-c", "import moto.server"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = Command::new(&python)
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.request("GET", "/", &[]).is_none() {
            assert!(Instant::now() < deadline, "moto's S3 server did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(server)
    }

    /// For a test binary's one test named `test`: a server, with this
    /// process's environment pointed at it ([`Self::env`]); `None`, the
    /// test reported skipped, where no Python here has moto's server.
    ///
    /// Call it first, before any thread reads the environment (the store's
    /// client reads it when first used); a binary's tests side by side
    /// would share it, so one test per binary.
    pub fn start_for_test(test: &str) -> Option<Self> {
        let Some(server) = Self::start() else {
            crate::skip_test(
                test,
                "no Python with moto's server (set SB_PYTHON, or pip install 'moto[server]')",
            );
            return None;
        };
        for (key, value) in server.env() {
            // SAFETY: as the caller is told, no other thread reads the
            // environment yet.
            unsafe { std::env::set_var(key, value) };
        }
        Some(server)
    }

    /// The variables that point the object store client (and any S3
    /// client) at this server, with test credentials.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Makes bucket `bucket`.
    pub fn make_bucket(&self, bucket: &str) {
        let status = self.request("PUT", &format!("/{bucket}"), &[]);
        assert_eq!(status, Some(200), "making bucket {bucket}");
    }

    /// Stores `bytes` as `key` of `bucket`.
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let status = self.request("PUT", &format!("/{bucket}/{key}"), bytes);
        assert_eq!(status, Some(200), "putting {bucket}/{key}");
    }

    /// Stores `bytes` as `key` of `bucket`, readable by anyone: at
    /// `http://127.0.0.1:<port>/<bucket>/<key>` without credentials.
    pub fn put_public(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let headers = [("x-amz-acl", "public-read")];
        let answer = self.exchange_with("PUT", &format!("/{bucket}/{key}"), &headers, bytes);
        assert!(
            matches!(answer, Some((200, _))),
            "putting {bucket}/{key}: {answer:?}"
        );
    }

    /// The keys in `bucket` under `prefix`, sorted.
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let (status, body) = self
            .exchange(
                "GET",
                &format!(
                    "/{bucket}?list-type=2&prefix={}",
                    url::form_urlencoded::byte_serialize(prefix.as_bytes()).collect::<String>()
                ),
                &[],
            )
            .expect("moto answers");
        assert_eq!(status, 200, "listing {bucket}/{prefix}: {body}");
        assert!(!body.contains("<IsTruncated>true"), "one page: {body}");
        let mut keys: Vec<String> = elements(&body, "Key");
        keys.sort();
        keys
    }

    /// The multipart uploads started in `bucket` and neither completed nor
    /// aborted: their keys.
    pub fn pending_uploads(&self, bucket: &str) -> Vec<String> {
        let (status, body) = self
            .exchange("GET", &format!("/{bucket}?uploads"), &[])
            .expect("moto answers");
        assert_eq!(status, 200, "listing {bucket}'s uploads: {body}");
        elements(&body, "Key")
    }

    /// Turns on moto's access checks for every request after this one, and
    /// makes the one user who passes them: it may list `bucket` and use
    /// the objects under `open_prefix`, and nothing else. Its access key
    /// id and secret key, for the client's environment; the test
    /// credentials of [`Self::env`] are refused from now on.
    pub fn lock_down(&self, bucket: &str, open_prefix: &str) -> (String, String) {
        self.iam("CreateUser", &[("UserName", "reader")]);
        let key = self.iam("CreateAccessKey", &[("UserName", "reader")]);
        let policy = format!(
            r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Action":"s3:*","Resource":["arn:aws:s3:::{bucket}","arn:aws:s3:::{bucket}/{open_prefix}*"]}}]}}"#
        );
        self.iam(
            "PutUserPolicy",
            &[
                ("UserName", "reader"),
                ("PolicyName", "open"),
                ("PolicyDocument", &policy),
            ],
        );
        // moto checks every request from the count given on (here, 0).
        let headers = [("Content-Type", "text/plain")];
        let answer = self.exchange_with("POST", "/moto-api/reset-auth", &headers, b"0");
        assert!(
            matches!(answer, Some((200, _))),
            "turning on moto's auth: {answer:?}"
        );
        let one = |tag| elements(&key, tag).pop().expect("an access key");
        (one("AccessKeyId"), one("SecretAccessKey"))
    }

    /// One IAM action, its answer's body. moto routes a request by the
    /// service its signature names, and checks no signature before
    /// [`Self::lock_down`].
    fn iam(&self, action: &str, params: &[(&str, &str)]) -> String {
        let form = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("Action", action)
            .append_pair("Version", "2010-05-08")
            .extend_pairs(params)
            .finish();
        let headers = [
            ("Content-Type", "application/x-www-form-urlencoded"),
            (
                "Authorization",
                "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/iam/aws4_request, SignedHeaders=host, Signature=0",
            ),
        ];
        let answer = self.exchange_with("POST", "/", &headers, form.as_bytes());
        match answer {
            Some((200, body)) => body,
            other => panic!("IAM {action}: {other:?}"),
        }
    }

    /// One plain HTTP request (moto takes unsigned ones): its status,
    /// `None` when nothing answers.
    fn request(&self, method: &str, path: &str, body: &[u8]) -> Option<u16> {
        self.exchange(method, path, body).map(|(status, _)| status)
    }

    /// One plain HTTP request: its status and body.
    fn exchange(&self, method: &str, path: &str, body: &[u8]) -> Option<(u16, String)> {
        self.exchange_with(method, path, &[], body)
    }

    /// One plain HTTP request with `headers`: its status and body.
    fn exchange_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Option<(u16, String)> {
        let port = self.port;
        let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
        let headers: String = headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).ok()?;
        stream.write_all(body).ok()?;
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        let status = response.split(' ').nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Some((status, body.to_string()))
    }
}

/// The texts of an XML answer's `<tag>` elements.
fn elements(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(&open)
        .skip(1)
        .filter_map(|rest| rest.split_once(&close).map(|(text, _)| text.to_string()))
        .collect()
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A proxy in front of an [`S3Server`] that answers its first `fail`
/// requests with `503 Slow Down`, as a throttled S3 does, and forwards the
/// rest: a client that retries gets through.
pub struct Throttle {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Requests answered 503 so far.
    pub refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Throttle {
    /// Starts one in front of `server`, refusing its first `fail` requests.
    pub fn start(server: &S3Server, fail: usize) -> Self {
        use std::sync::atomic::Ordering;
        let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = refused.clone();
        let proxy = FaultProxy::start(server, move |_| {
            let refuse = count
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < fail).then_some(n + 1)
                })
                .is_ok();
            if refuse {
                Fault::SlowDown
            } else {
                Fault::Forward
            }
        });
        Self {
            port: proxy.port,
            refused,
        }
    }
}

/// What a [`FaultProxy`] does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwards it and returns the server's answer.
    Forward,
    /// Answers `503 Slow Down` without forwarding it (a client retries).
    SlowDown,
    /// Answers `400` (not retried) without forwarding it: the request
    /// failed and did nothing.
    Refuse,
    /// Forwards it, then answers `400` in place of the server's answer:
    /// the request took effect, yet its client hears it failed.
    FailAfter,
}

/// A proxy in front of an [`S3Server`] that does to each request what
/// its rule, given the request's first line and headers, says.
pub struct FaultProxy {
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl FaultProxy {
    /// Starts one in front of `server`.
    pub fn start(server: &S3Server, rule: impl Fn(&str) -> Fault + Send + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = server.port;
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Some(request) = read_request(&client) else {
                    continue;
                };
                let head = String::from_utf8_lossy(&request);
                let head = head.split("\r\n\r\n").next().unwrap_or("").to_string();
                let mut client = client;
                let reply = |status: &str, code: &str| {
                    let body = format!(
                        "<Error><Code>{code}</Code><Message>injected by the test</Message></Error>"
                    );
                    format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                let fault = rule(&head);
                let answer = match fault {
                    Fault::SlowDown => reply("503 Slow Down", "SlowDown").into_bytes(),
                    Fault::Refuse => reply("400 Bad Request", "InvalidRequest").into_bytes(),
                    Fault::Forward | Fault::FailAfter => {
                        let Ok(mut moto) = TcpStream::connect(("127.0.0.1", upstream)) else {
                            continue;
                        };
                        let mut response = Vec::new();
                        if moto.write_all(&request).is_err()
                            || moto.read_to_end(&mut response).is_err()
                        {
                            continue;
                        }
                        match fault {
                            Fault::FailAfter => {
                                reply("400 Bad Request", "InvalidRequest").into_bytes()
                            }
                            _ => response,
                        }
                    }
                };
                let _ = client.write_all(&answer);
            }
        });
        Self { port }
    }
}

/// One HTTP request read whole from `stream`, its `Connection` header made
/// `close` (one request per connection: the proxy reads the reply to its
/// end).
fn read_request(mut stream: &TcpStream) -> Option<Vec<u8>> {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        raw.push(byte[0]);
    }
    let head = String::from_utf8(raw).ok()?;
    let mut lines: Vec<&str> = head
        .trim_end()
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    let length: usize = lines
        .iter()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    lines.push("Connection: close");
    let mut request = format!("{}\r\n\r\n", lines.join("\r\n")).into_bytes();
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).ok()?;
    request.extend(body);
    Some(request)
}
