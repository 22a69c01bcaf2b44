//! Files in object stores (issue 27): `s3://`, `gs://`, `az://` (and
//! `abfs://`) and `http(s)://` URLs where a Parquet source takes a path,
//! through the `object_store` crate. Credentials and options come from
//! each cloud's standard environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`):
//! `AWS_ENDPOINT_URL` points S3 at an S3-compatible store, and
//! `AWS_ALLOW_HTTP=true` lets that be plain HTTP.
//!
//! A URL travels in a plan as a source split's path, so each node of a
//! cluster reads its own splits from the store, with its own environment.
//! A Parquet file is read by ranges ([`ObjectReader`]): its footer, then
//! for each row group read, the byte ranges of the columns read, fetched
//! together (several requests in flight) and held while that row group
//! decodes. Other files are read as files ([`ObjectFile`]: `Read` and
//! `Seek` over range requests of up to 8 MiB).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::file::reader::{ChunkReader, Length};
use url::Url;

use crate::error::{Error, Result};
use crate::object::manifest;
use crate::object::read_ahead::ReadAhead;
use crate::object::runtime::block_on;

/// The URL schemes read through `object_store`.
const SCHEMES: [&str; 8] = ["s3", "s3a", "gs", "az", "abfs", "abfss", "http", "https"];

/// `path` as an object store URL, when it is one (`s3://`, `gs://`,
/// `az://`, `abfs(s)://`, `http(s)://`): such a path names the same object
/// on every node.
///
/// ```
/// use std::path::Path;
/// assert_eq!(streambatch_plan::object_url(Path::new("s3://b/k.parquet")), Some("s3://b/k.parquet"));
/// assert_eq!(streambatch_plan::object_url(Path::new("data/k.parquet")), None);
/// ```
pub fn url_of(path: &Path) -> Option<&str> {
    let path = path.to_str()?;
    let (scheme, _) = path.split_once("://")?;
    SCHEMES.contains(&scheme).then_some(path)
}

/// The whole object at `url` (an [`url_of`] URL), in one request, with
/// the credentials of this process's environment: what an operator reads
/// a small file it needs whole by (a model).
pub fn read_object(url: &str) -> Result<Bytes> {
    Object::at(url)?.read()
}

/// An object: its store and its path there, and its URL for errors.
#[derive(Clone)]
pub(crate) struct Object {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) path: ObjectPath,
    pub(crate) url: String,
}

impl Object {
    pub(crate) fn at(url: &str) -> Result<Self> {
        let parsed = Url::parse(url).map_err(|e| invalid(url, e))?;
        let (store, path) = store_for(&parsed)?;
        Ok(Self {
            store,
            path,
            url: url.to_string(),
        })
    }

    /// The object `key` of the same store, at `url`.
    pub(crate) fn sibling(&self, url: String, key: &str) -> Result<Self> {
        let path = ObjectPath::parse(key).map_err(|e| invalid(&url, e))?;
        Ok(Self {
            store: self.store.clone(),
            path,
            url,
        })
    }

    /// Its bytes, in one request (counted as a read).
    pub(crate) fn read(&self) -> Result<Bytes> {
        block_on(async { self.store.get(&self.path).await?.bytes().await })
            .map(counted)
            .map_err(|e| self.error("reading", e))
    }

    /// Its size, asked of the store.
    fn size(&self) -> Result<u64> {
        let meta = block_on(self.store.head(&self.path)).map_err(|e| self.error("opening", e))?;
        Ok(meta.size)
    }

    pub(crate) fn error(&self, what: &str, e: object_store::Error) -> Error {
        Error::Invalid(format!("{what} {}: {e}", self.url))
    }
}

/// The store of `url` and the object's path in it. A store is made once
/// per bucket (or container, or HTTP server) and kept, so that its
/// connections are reused and its client, which loads the system's root
/// certificates, is built once rather than for every object.
fn store_for(url: &Url) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> = OnceLock::new();
    let bad = |e: object_store::Error| invalid(url.as_str(), e);
    let (_, path) = object_store::ObjectStoreScheme::parse(url).map_err(|e| bad(e.into()))?;
    let path = ObjectPath::parse(path).map_err(|e| bad(e.into()))?;
    let mut key = url[..url::Position::BeforePath].to_string();
    // A cloud's https URL may name its bucket or container in its path
    // (taken out of the object's path): part of the store's identity.
    let whole = ObjectPath::from_url_path(url.path()).ok();
    if url.scheme().starts_with("http") && whole.as_ref() != Some(&path) {
        key.push('/');
        key.push_str(url.path_segments().and_then(|mut s| s.next()).unwrap_or(""));
    }
    let stores = STORES.get_or_init(Default::default);
    // Held while a store is made: threads opening a bucket's files at
    // once make it once.
    let mut stores = stores.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(store) = stores.get(&key) {
        return Ok((store.clone(), path));
    }
    let options = cloud_options(url.scheme()).map_err(|e| invalid(url.as_str(), e))?;
    let (made, _) = object_store::parse_url_opts(url, options).map_err(bad)?;
    let store: Arc<dyn ObjectStore> = Arc::from(made);
    stores.insert(key, store.clone());
    Ok((store, path))
}

/// The options of a store of `scheme`: its cloud's own variables of the
/// environment only (`AWS_*`, `GOOGLE_*`, `AZURE_*`), so that a variable
/// of another program (a `TOKEN`, an `ENDPOINT`) never reaches a store,
/// and for S3 what the AWS profile's files add (`aws_profile.rs`; Google's
/// credentials file `object_store` reads itself). An `http://` URL asks for
/// plain HTTP itself (the client refuses it unless allowed).
fn cloud_options(scheme: &str) -> Result<Vec<(String, String)>> {
    let prefix = match scheme {
        "s3" | "s3a" => "AWS_",
        "gs" => "GOOGLE_",
        "az" | "abfs" | "abfss" => "AZURE_",
        "http" => return Ok(vec![("allow_http".into(), "true".into())]),
        _ => return Ok(Vec::new()),
    };
    let mut options: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with(prefix))
        .collect();
    if prefix == "AWS_" {
        let from_files = crate::object::aws_profile::options(&options)?;
        // Keys from a file come with their own token, if any: never the
        // environment's, left from other keys.
        if from_files.iter().any(|(k, _)| k == "aws_access_key_id") {
            options.retain(|(k, _)| k != "AWS_SESSION_TOKEN");
        }
        options.extend(from_files);
        // A write's manifest is put only if no other write's came first
        // (If-Match / If-None-Match: AWS S3, MinIO, R2, moto); a store
        // without them is told apart when a put is refused as such.
        if !options
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("aws_conditional_put"))
        {
            options.push(("aws_conditional_put".into(), "etag".into()));
        }
    }
    Ok(options)
}

fn invalid(url: &str, e: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("object store URL {url}: {e}"))
}

/// Expands an object store URL into the files it names, sorted: the
/// object itself, the objects directly under it as a folder (not those in
/// folders below; names starting with `.` or `_` left out, as in a local
/// directory), or the objects matching it as a glob (`*` or `[..]` in its
/// path, neither matching a `/`). An `http(s)://` URL names one file: an
/// HTTP server has no listing.
pub(crate) fn expand_url(pattern: &str) -> Result<Vec<PathBuf>> {
    let object = Object::at(pattern)?;
    let url = Url::parse(pattern).map_err(|e| invalid(pattern, e))?;
    let key = object.path.as_ref();
    let glob_at = key.find(['*', '[']);
    let keys: Vec<String> = match glob_at {
        Some(_) if url.scheme().starts_with("http") => {
            return Err(invalid(
                pattern,
                "an http(s) URL names one file, not a glob",
            ));
        }
        Some(at) => {
            let prefix = key[..at].rsplit_once('/').map_or("", |(dir, _)| dir);
            let matcher = glob::Pattern::new(key).map_err(|e| invalid(pattern, e))?;
            let within_folders = glob::MatchOptions {
                require_literal_separator: true,
                ..Default::default()
            };
            let listed = list(&object, prefix, true)?;
            let (mut keys, others): (Vec<String>, Vec<String>) = listed
                .into_iter()
                .partition(|k| matcher.matches_with(k, within_folders));
            // The manifests of the matches' folders too (a glob for
            // `*.parquet` does not match one): the matches must honour
            // them; hidden, they are left out below.
            let folder = |key: &str| key.rsplit_once('/').map_or("", |(f, _)| f).to_string();
            let folders: std::collections::HashSet<String> =
                keys.iter().map(|k| folder(k)).collect();
            keys.extend(
                others
                    .into_iter()
                    .filter(|k| manifest::is_manifest(k) && folders.contains(&folder(k))),
            );
            keys
        }
        // A bucket's URL ending in `/` names a folder: no request for an
        // object (an HTTP server has no listing).
        None if pattern.ends_with('/') && !url.scheme().starts_with("http") => {
            list(&object, key, false)?
        }
        None => match block_on(object.store.head(&object.path)) {
            Ok(_) => vec![key.to_string()],
            Err(object_store::Error::NotFound { .. }) if !url.scheme().starts_with("http") => {
                list(&object, key, false)?
            }
            Err(e) => return Err(object.error("reading", e)),
        },
    };
    // Parts a committed write's manifest does not list are not its output.
    let keys = manifest::honour(keys, |key| object.sibling(key_url(&url, key)?, key)?.read())?;
    let mut files = Vec::with_capacity(keys.len());
    for key in keys.iter().filter(|k| !is_hidden(k)) {
        files.push(PathBuf::from(key_url(&url, key)?));
    }
    if files.is_empty() {
        return Err(Error::NoFiles {
            pattern: pattern.to_string(),
        });
    }
    files.sort();
    Ok(files)
}

/// The URL of `key` in `url`'s bucket, its parts percent-encoded where a
/// URL needs it (`#`, `?`).
pub(crate) fn key_url(url: &Url, key: &str) -> Result<String> {
    let mut file = url.clone();
    file.set_query(None);
    file.set_fragment(None);
    file.path_segments_mut()
        .map_err(|()| invalid(url.as_str(), "no path"))?
        .clear()
        .extend(key.split('/'));
    Ok(file.to_string())
}

/// The keys of the objects in folder `prefix` (`a/b` lists `a/b/..`): in
/// the folders below it too when `deep`.
pub(crate) fn list(object: &Object, prefix: &str, deep: bool) -> Result<Vec<String>> {
    let prefix = (!prefix.is_empty()).then(|| ObjectPath::from(prefix));
    let key = |meta: object_store::ObjectMeta| meta.location.as_ref().to_string();
    block_on(async {
        if !deep {
            let listed = object.store.list_with_delimiter(prefix.as_ref()).await;
            let listed = listed.map_err(|e| object.error("listing", e))?;
            return Ok(listed.objects.into_iter().map(key).collect());
        }
        let mut listed = object.store.list(prefix.as_ref());
        let mut keys = Vec::new();
        while let Some(meta) = listed.next().await {
            keys.push(key(meta.map_err(|e| object.error("listing", e))?));
        }
        Ok(keys)
    })
}

/// A key with a part starting with `.` or `_` (`_SUCCESS`, a writer's
/// `_temporary/` folder).
fn is_hidden(key: &str) -> bool {
    key.split('/')
        .any(|part| part.starts_with('.') || part.starts_with('_'))
}

/// Bytes this process has read from object stores.
static READ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes this process has read from object stores so far (every source's
/// range requests; a Parquet read that prunes reads less).
pub fn bytes_read() -> u64 {
    READ.load(std::sync::atomic::Ordering::Relaxed)
}

/// Requests for bytes this process has made to object stores.
static GETS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Requests for bytes (`GET`s, each of one range) this process has made
/// to object stores so far: a Parquet read that prunes makes fewer.
pub fn gets() -> u64 {
    GETS.load(std::sync::atomic::Ordering::Relaxed)
}

/// `bytes`, one request's answer, counted.
fn counted(bytes: Bytes) -> Bytes {
    READ.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
    GETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    bytes
}

/// Bytes from the end of a Parquet object fetched on opening it: its
/// footer, for all but the widest schemas.
const TAIL: u64 = 16 << 10;

/// The end of an object as one request fetched it.
#[derive(Clone)]
struct Tail {
    size: u64,
    e_tag: Option<String>,
    /// Where `bytes` start in the object.
    start: u64,
    bytes: Bytes,
}

/// Tails kept, by URL, at most: 16 KiB each.
const TAILS_KEPT: usize = 1024;

/// The tail kept for `url`, if any.
fn kept_tail(url: &str) -> Option<Tail> {
    let tails = tails().lock().unwrap_or_else(|p| p.into_inner());
    tails.get(url).cloned()
}

fn tails() -> &'static Mutex<HashMap<String, Tail>> {
    static TAILS: OnceLock<Mutex<HashMap<String, Tail>>> = OnceLock::new();
    TAILS.get_or_init(Default::default)
}

/// Keeps `tail` of `url` (all are dropped when too many are kept); a tail
/// whose object has no version tag is not kept, since it could not be
/// told from a newer one.
fn remember(url: &str, tail: &Tail) {
    if tail.e_tag.is_none() {
        return;
    }
    let mut tails = tails().lock().unwrap_or_else(|p| p.into_inner());
    if tails.len() >= TAILS_KEPT && !tails.contains_key(url) {
        tails.clear();
    }
    tails.insert(url.to_string(), tail.clone());
}

/// The size and version of each object of `urls` that the store has
/// (absent ones are left out), asked 16 at a time: what a resumed write
/// compares its input by. The version is the object's tag (ETag), or its
/// modification time where the store tags none. Never from the tails kept
/// here, which may be of an earlier version; an error other than "not
/// found" is returned, not taken for an absent object.
pub(crate) fn versions(urls: &[&str]) -> Result<HashMap<String, (u64, String)>> {
    let objects = urls
        .iter()
        .map(|url| Object::at(url))
        .collect::<Result<Vec<_>>>()?;
    let heads = objects.iter().map(|object| async move {
        match object.store.head(&object.path).await {
            Ok(meta) => {
                let version = meta
                    .e_tag
                    .unwrap_or_else(|| format!("modified {}", meta.last_modified));
                Ok(Some((object.url.clone(), (meta.size, version))))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(object.error("reading", e)),
        }
    });
    let found = block_on(
        futures::stream::iter(heads)
            .buffer_unordered(16)
            .collect::<Vec<_>>(),
    );
    let mut versions = HashMap::new();
    for head in found {
        versions.extend(head?);
    }
    Ok(versions)
}

/// The last `TAIL` bytes of `object`, with its size and version tag.
fn fetch_tail(object: &Object) -> Result<Tail> {
    let options = object_store::GetOptions {
        range: Some(object_store::GetRange::Suffix(TAIL)),
        ..Default::default()
    };
    let tail = block_on(async {
        let got = object.store.get_opts(&object.path, options).await?;
        let (size, e_tag, start) = (got.meta.size, got.meta.e_tag.clone(), got.range.start);
        Ok(Tail {
            size,
            e_tag,
            start,
            bytes: counted(got.bytes().await?),
        })
    });
    tail.map_err(|e| object.error("opening", e))
}

/// A Parquet file in an object store, as the `parquet` crate reads files:
/// each read a range request, except what [`prefetch`](Self::prefetch)
/// fetched (a row group's columns), which is read from memory.
#[derive(Clone)]
pub(crate) struct ObjectReader {
    object: Object,
    size: u64,
    /// The version of the object whose footer was read, when the store
    /// tags versions: every later range must come from it.
    e_tag: Option<String>,
    /// Ranges fetched ahead: (first byte, bytes).
    fetched: Arc<Mutex<Vec<(u64, Bytes)>>>,
    /// No row group was fetched yet (what [`ReadAhead`] fetches).
    first_read: Arc<std::sync::atomic::AtomicBool>,
}

impl ObjectReader {
    /// The file at `url`: its last 16 KiB fetched in one request, which
    /// tells its size too and holds a footer of up to that size (a larger
    /// one is fetched as it is read). The tail is kept for this process's
    /// next opening of the same URL (planning a dataset reads each file's
    /// footer, and its task reads it again): its row groups are then
    /// fetched only if the object is still the one the tail came from.
    pub(crate) fn open(url: &str) -> Result<Self> {
        let object = Object::at(url)?;
        // The lock is let go before fetching: footers are fetched side by side.
        let tail = match kept_tail(url) {
            Some(tail) => tail,
            None => {
                let tail = fetch_tail(&object)?;
                remember(url, &tail);
                tail
            }
        };
        Ok(Self::with_tail(object, tail))
    }

    /// The file at `url` when its tail is kept, without a request.
    pub(crate) fn kept(url: &str) -> Option<Self> {
        let tail = kept_tail(url)?;
        Some(Self::with_tail(Object::at(url).ok()?, tail))
    }

    /// The version of the object whose footer was read, when the store
    /// tags versions.
    pub(crate) fn e_tag(&self) -> Option<&str> {
        self.e_tag.as_deref()
    }

    fn with_tail(object: Object, tail: Tail) -> Self {
        Self {
            size: tail.size,
            e_tag: tail.e_tag,
            object,
            fetched: Arc::new(Mutex::new(vec![(tail.start, tail.bytes)])),
            first_read: Arc::new(true.into()),
        }
    }

    /// Fetches `ranges` together (near ones in one request, several
    /// requests in flight), dropping what was fetched before; the first
    /// time, takes them from [`ReadAhead`] when a fetch of them was started
    /// ahead (of the version read here).
    pub(crate) fn prefetch(&self, ranges: Vec<Range<u64>>) -> Result<()> {
        let first = self
            .first_read
            .swap(false, std::sync::atomic::Ordering::Relaxed);
        let ahead = first
            .then(|| ReadAhead::global().take(&self.object.url, self.e_tag.as_deref(), &ranges))
            .flatten();
        let bytes = match ahead {
            Some(bytes) => bytes,
            None => block_on(self.clone().fetch_all(ranges.clone())).map_err(|e| self.error(e))?,
        };
        let fetched = ranges.iter().map(|r| r.start).zip(bytes).collect();
        *self.fetched.lock().unwrap_or_else(|p| p.into_inner()) = fetched;
        Ok(())
    }

    /// The bytes of `ranges` (near ones in one request, several requests
    /// in flight).
    pub(crate) async fn fetch_all(
        self,
        ranges: Vec<Range<u64>>,
    ) -> object_store::Result<Vec<Bytes>> {
        let fetch = |range: Range<u64>| self.fetch_async(range);
        object_store::coalesce_ranges(&ranges, fetch, object_store::OBJECT_STORE_COALESCE_DEFAULT)
            .await
    }

    /// A failed read's error; an object changed since its footer was read
    /// is said to be, and its tail is no longer kept.
    fn error(&self, e: object_store::Error) -> Error {
        let object = &self.object;
        if let object_store::Error::Precondition { .. } = e {
            tails()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&object.url);
            return Error::Invalid(format!(
                "{} changed while it was read (its footer is of an earlier version): read it again",
                object.url
            ));
        }
        object.error("reading", e)
    }

    /// The bytes of `range`, of the version whose footer was read.
    async fn fetch_async(&self, range: Range<u64>) -> object_store::Result<Bytes> {
        let options = object_store::GetOptions {
            range: Some(range.into()),
            if_match: self.e_tag.clone(),
            ..Default::default()
        };
        let got = self
            .object
            .store
            .get_opts(&self.object.path, options)
            .await?;
        got.bytes().await.map(counted)
    }

    /// `len` bytes from `start`, from what was fetched ahead when it holds
    /// them (`None` for `len`: to the end of that range).
    fn held(&self, start: u64, len: Option<usize>) -> Option<Bytes> {
        let fetched = self.fetched.lock().unwrap_or_else(|p| p.into_inner());
        fetched.iter().find_map(|(at, bytes)| {
            let from = usize::try_from(start.checked_sub(*at)?).ok()?;
            // Read on from `start`: a range that ends there holds none of it.
            let rest = bytes.len().checked_sub(from).filter(|&rest| rest > 0)?;
            let to = from.checked_add(len.unwrap_or(rest))?;
            (to <= bytes.len()).then(|| bytes.slice(from..to))
        })
    }

    fn fetch(&self, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        block_on(self.fetch_async(range))
            .map_err(|e| parquet::errors::ParquetError::External(Box::new(self.error(e))))
    }
}

impl Length for ObjectReader {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for ObjectReader {
    type T = std::io::Cursor<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let bytes = match self.held(start, None) {
            Some(bytes) => bytes,
            None => self.fetch(start..self.size)?,
        };
        Ok(std::io::Cursor::new(bytes))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        if length == 0 {
            return Ok(Bytes::new());
        }
        match self.held(start, Some(length)) {
            Some(bytes) => Ok(bytes),
            None => self.fetch(start..start + length as u64),
        }
    }
}

/// Bytes an [`ObjectFile`] fetches at once.
const WINDOW: u64 = 8 << 20;

/// An object read as a file: `Read` and `Seek`, each read served from a
/// window of up to 8 MiB fetched by one range request (a file read
/// through streams, one that is sought in reads what it seeks).
pub(crate) struct ObjectFile {
    object: Object,
    size: u64,
    at: u64,
    /// The bytes fetched last, from this position.
    window: (u64, Bytes),
}

impl ObjectFile {
    /// The object at `url` (its size asked of the store).
    pub(crate) fn open(url: &str) -> Result<Self> {
        let object = Object::at(url)?;
        Ok(Self {
            size: object.size()?,
            object,
            at: 0,
            window: (0, Bytes::new()),
        })
    }

    /// Its size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }
}

impl Read for ObjectFile {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at >= self.size || buf.is_empty() {
            return Ok(0);
        }
        let (start, bytes) = &self.window;
        let inside = self.at >= *start && self.at < start + bytes.len() as u64;
        if !inside {
            let range = self.at..(self.at + WINDOW).min(self.size);
            let object = &self.object;
            let bytes = block_on(object.store.get_range(&object.path, range))
                .map(counted)
                .map_err(|e| std::io::Error::other(object.error("reading", e)))?;
            self.window = (self.at, bytes);
        }
        let (start, bytes) = &self.window;
        let from = (self.at - start) as usize;
        let n = buf.len().min(bytes.len() - from);
        buf[..n].copy_from_slice(&bytes[from..from + n]);
        self.at += n as u64;
        Ok(n)
    }
}

impl Seek for ObjectFile {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let at = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
            SeekFrom::Current(d) => self.at.checked_add_signed(d),
        };
        let at = at.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "a seek before the start")
        })?;
        self.at = at;
        Ok(at)
    }
}
