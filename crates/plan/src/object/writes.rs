//! Writing objects (issue 27): a new object written as a file is uploaded
//! as it is written, in parts of 8 MiB (a multipart upload, two parts in
//! flight), or in one request when it is smaller. An object store shows
//! an object only once its upload completes, so it appears whole or not
//! at all; an upload dropped before its end is aborted, so that no part
//! is left stored (and billed) in the bucket.

use std::io::Write;

use bytes::Bytes;
use object_store::ObjectStoreExt;
use object_store::buffered::BufWriter;
use tokio::io::AsyncWriteExt;

use crate::error::{Error, Result};
use crate::object::files::Object;
use crate::object::runtime::block_on;

/// Bytes gathered before each part is sent (S3's parts are 5 MiB at least).
const PART: usize = 8 << 20;

/// A new object at a URL, written as a file: see the module's text. Call
/// [`ObjectUpload::finish`] at the end; dropped without it, nothing is
/// written.
pub(crate) struct ObjectUpload {
    object: Object,
    /// `None` once finished.
    writer: Option<BufWriter>,
    gathered: Vec<u8>,
}

impl ObjectUpload {
    /// An upload to `url`, replacing the object there when it finishes.
    pub(crate) fn create(url: &str) -> Result<Self> {
        let object = Object::at(url)?;
        let writer = BufWriter::with_capacity(object.store.clone(), object.path.clone(), PART)
            .with_max_concurrency(2);
        Ok(Self {
            object,
            writer: Some(writer),
            gathered: Vec::new(),
        })
    }

    /// Sends what was gathered.
    fn send(&mut self) -> std::io::Result<()> {
        let bytes = Bytes::from(std::mem::take(&mut self.gathered));
        let Some(writer) = self.writer.as_mut() else {
            return Err(std::io::Error::other("written after its end"));
        };
        block_on(writer.put(bytes)).map_err(|e| self.failed(e))
    }

    fn failed(&self, e: object_store::Error) -> std::io::Error {
        std::io::Error::other(self.object.error("writing", e))
    }

    /// Sends the rest and completes the upload: the object appears.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.send().map_err(|e| write_error(&self.object, e))?;
        let mut writer = self.writer.take().expect("finished once");
        // A multipart upload that fails to complete is aborted by the
        // writer itself (which may not be aborted again: it would panic).
        block_on(writer.shutdown()).map_err(|e| write_error(&self.object, e))
    }
}

fn write_error(object: &Object, e: impl std::fmt::Display) -> Error {
    Error::WriteFailed {
        path: object.url.clone().into(),
        message: e.to_string(),
    }
}

impl Write for ObjectUpload {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.gathered.extend_from_slice(buf);
        if self.gathered.len() >= PART {
            self.send()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ObjectUpload {
    fn drop(&mut self) {
        if let Some(mut writer) = self.writer.take() {
            let _ = block_on(writer.abort());
        }
    }
}

/// Stores `bytes` as the object at `url`, in one request.
pub(crate) fn put(url: &str, bytes: Vec<u8>) -> Result<()> {
    let object = Object::at(url)?;
    block_on(object.store.put(&object.path, bytes.into()))
        .map(drop)
        .map_err(|e| write_error(&object, e))
}

/// A version of an object, for a put that must find it unchanged.
pub(crate) type Version = object_store::UpdateVersion;

/// What a conditional put found.
pub(crate) enum Put {
    /// Stored; the object's new version.
    Done(Version),
    /// Another writer's object was there (or changed) first.
    Conflict,
}

/// The versions of the objects directly in folder `url`, by name.
pub(crate) fn versions_in(url: &str) -> Result<std::collections::HashMap<String, Version>> {
    let folder = Object::at(url)?;
    let listed = block_on(async {
        let prefix = Some(&folder.path).filter(|p| !p.as_ref().is_empty());
        folder.store.list_with_delimiter(prefix).await
    })
    .map_err(|e| folder.error("listing", e))?;
    Ok(listed
        .objects
        .into_iter()
        .filter_map(|meta| {
            let name = meta.location.filename()?.to_string();
            let version = Version {
                e_tag: meta.e_tag,
                version: meta.version,
            };
            Some((name, version))
        })
        .collect())
}

/// Stores `bytes` at `url` only if the object there is still `base` (with
/// `None`, only if there is none): the manifest's put, so that of two
/// writes into one folder the later fails rather than undo the other's
/// commit. A store that cannot put conditionally gets a plain put, and a
/// warning.
pub(crate) fn put_if(url: &str, bytes: Vec<u8>, base: Option<Version>) -> Result<Put> {
    let object = Object::at(url)?;
    let mode = match base {
        Some(version) => object_store::PutMode::Update(version),
        None => object_store::PutMode::Create,
    };
    let payload: object_store::PutPayload = bytes.into();
    let put = |mode: object_store::PutMode| {
        let options = object_store::PutOptions::from(mode);
        block_on(
            object
                .store
                .put_opts(&object.path, payload.clone(), options),
        )
    };
    let done = |result: object_store::PutResult| {
        Put::Done(Version {
            e_tag: result.e_tag,
            version: result.version,
        })
    };
    match put(mode) {
        Ok(result) => Ok(done(result)),
        Err(
            object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. },
        ) => Ok(Put::Conflict),
        Err(object_store::Error::NotImplemented { .. }) => {
            tracing::warn!(
                url,
                "this store cannot put conditionally: two writes into one folder at once are not told apart"
            );
            put(object_store::PutMode::Overwrite)
                .map(done)
                .map_err(|e| write_error(&object, e))
        }
        Err(e) => Err(write_error(&object, e)),
    }
}

/// The key of the object at `url` in its store.
pub(crate) fn key(url: &str) -> Result<String> {
    Ok(Object::at(url)?.path.to_string())
}

/// The keys of the objects directly in folder `url`.
pub(crate) fn keys_in(url: &str) -> Result<Vec<String>> {
    let folder = Object::at(url)?;
    crate::object::files::list(&folder, folder.path.as_ref(), false)
}

/// Whether the object at `url` exists.
pub(crate) fn exists(url: &str) -> Result<bool> {
    let object = Object::at(url)?;
    match block_on(object.store.head(&object.path)) {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(object.error("reading", e)),
    }
}

/// Requests of a commit's copies or deletes in flight at once: each is a
/// round trip of tens of milliseconds to a cloud store.
const IN_FLIGHT: usize = 16;

/// Runs `requests`, [`IN_FLIGHT`] at once; the first error.
fn side_by_side<F>(requests: Vec<F>) -> Result<()>
where
    F: std::future::Future<Output = Result<()>> + Send,
{
    use futures::{StreamExt, TryStreamExt};
    let requests = futures::stream::iter(requests).buffer_unordered(IN_FLIGHT);
    block_on(requests.try_collect::<Vec<()>>()).map(drop)
}

/// Copies each object `from` to `to` in the same store (the store copies
/// it: its bytes do not pass through this process), several at once.
pub(crate) fn copy_all(pairs: &[(String, String)]) -> Result<()> {
    let mut copies = Vec::with_capacity(pairs.len());
    for (from, to) in pairs {
        let (from, to) = (Object::at(from)?, Object::at(to)?);
        copies.push(async move {
            let copied = from.store.copy(&from.path, &to.path).await;
            copied.map_err(|e| write_error(&to, e))
        });
    }
    side_by_side(copies)
}

/// Moves each object `from` to `to`: the store's copies, then the
/// deletes of the sources, several at once.
pub(crate) fn move_all(pairs: &[(String, String)]) -> Result<()> {
    copy_all(pairs)?;
    let sources: Vec<String> = pairs.iter().map(|(from, _)| from.clone()).collect();
    delete_all(&sources)
}

/// Deletes the objects at `urls` (one gone already is no error), several
/// at once.
pub(crate) fn delete_all(urls: &[String]) -> Result<()> {
    let mut deletes = Vec::with_capacity(urls.len());
    for url in urls {
        let object = Object::at(url)?;
        deletes.push(async move {
            match object.store.delete(&object.path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(object.error("deleting", e)),
            }
        });
    }
    side_by_side(deletes)
}

/// The URLs of the objects in folder `url`, with their names there: those
/// directly in it, or also those in the folders below when `deep` (their
/// names then paths from it). An absent folder is empty.
pub(crate) fn list(url: &str, deep: bool) -> Result<Vec<(String, String)>> {
    let folder = Object::at(url)?;
    let parsed = url::Url::parse(url).map_err(|e| Error::Invalid(format!("{url}: {e}")))?;
    let prefix = folder.path.as_ref().to_string();
    let mut found = Vec::new();
    for key in crate::object::files::list(&folder, &prefix, deep)? {
        let name = key
            .strip_prefix(&prefix)
            .map_or(key.as_str(), |n| n.trim_start_matches('/'));
        found.push((
            crate::object::files::key_url(&parsed, &key)?,
            name.to_string(),
        ));
    }
    Ok(found)
}

/// What folder `url` holds directly, in one listing: each object's name
/// and each folder's, with whether it is a folder.
pub(crate) fn children(url: &str) -> Result<Vec<(String, bool)>> {
    let folder = Object::at(url)?;
    let prefix = folder.path.clone();
    let listed = block_on(folder.store.list_with_delimiter(Some(&prefix)))
        .map_err(|e| folder.error("listing", e))?;
    let name = |path: &object_store::path::Path| path.filename().map(str::to_string);
    let objects = listed.objects.iter().filter_map(|o| name(&o.location));
    let folders = listed.common_prefixes.iter().filter_map(name);
    Ok(objects
        .map(|n| (n, false))
        .chain(folders.map(|n| (n, true)))
        .collect())
}

/// The folders directly in folder `url` (their names).
pub(crate) fn folders(url: &str) -> Result<Vec<String>> {
    let children = children(url)?.into_iter();
    Ok(children
        .filter(|(_, folder)| *folder)
        .map(|(n, _)| n)
        .collect())
}
