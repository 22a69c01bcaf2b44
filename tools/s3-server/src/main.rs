//! An S3-compatible server over a folder, for the W4-from-S3 benchmark:
//! `streambatch-s3-server <folder> <port> <access key> <secret key>
//! [latency ms]` serves the folder's subfolders as buckets on
//! 127.0.0.1:<port>, checking each request's SigV4 signature against the
//! one key pair, and answers each GET `latency ms` late (0 by default), as
//! a store across a network would.
//!
//! It is s3s-fs (the `s3s` crate's file system server) with one change:
//! a GET is answered from the object's bytes and headers held in memory
//! (read once, again when the file changes), where s3s-fs opens and reads
//! the file and two files of metadata for every request, streaming the
//! bytes in reads of 4 KiB, each a trip to tokio's blocking pool (for
//! W4's 1.2 MB row groups, 300 of them a request). The benchmark runs the
//! server on the job's own cores, so what it spends per request is taken
//! from the job; an S3 service spends it on its own machines.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result, s3_error};

/// s3s-fs, its GETs answered from memory.
struct Server {
    fs: s3s_fs::FileSystem,
    root: PathBuf,
    /// The objects read so far, by file.
    cache: Mutex<HashMap<PathBuf, Arc<Held>>>,
    /// How late a GET is answered.
    latency: std::time::Duration,
}

impl Server {
    /// s3s-fs's answer, but "no such key" for a folder's name (s3s-fs
    /// fails with an internal error there; S3 has no folders, and clients
    /// ask for a prefix's name as an object before listing it).
    async fn head(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        if self
            .root
            .join(&req.input.bucket)
            .join(&req.input.key)
            .is_dir()
        {
            return Err(s3_error!(NoSuchKey));
        }
        self.fs.head_object(req).await
    }

    /// The object's bytes in `range`, with the headers s3s-fs gives it,
    /// from memory; s3s-fs reads it (and its metadata) the first time and
    /// when its file has changed since.
    async fn get(
        &self,
        mut req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let path = self.root.join(&req.input.bucket).join(&req.input.key);
        if path.is_dir() {
            return Err(s3_error!(NoSuchKey));
        }
        let Ok(stamp) = std::fs::metadata(&path).and_then(|m| Ok((m.len(), m.modified()?))) else {
            return self.fs.get_object(req).await; // s3s-fs names what is wrong
        };
        let range = req.input.range.take();
        let held = self.cache.lock().unwrap().get(&path).cloned();
        let object = match held.filter(|held| held.stamp == stamp) {
            Some(object) => object,
            None => {
                // s3s-fs's answer for the whole object, for its headers.
                let answer = self.fs.get_object(req).await?.output;
                let read = tokio::task::spawn_blocking({
                    let path = path.clone();
                    move || std::fs::read(path)
                });
                let bytes = read
                    .await
                    .map_err(|e| s3_error!(InternalError, "{e}"))?
                    .map_err(|e| s3_error!(InternalError, "{e}"))?;
                let object = Arc::new(Held::new(stamp, bytes.into(), answer));
                self.cache.lock().unwrap().insert(path, object.clone());
                object
            }
        };
        Ok(S3Response::new(object.answer(range)?))
    }
}

/// An object as a GET answers it: its bytes and headers, and the length
/// and modification time of its file when they were read.
struct Held {
    stamp: (u64, SystemTime),
    bytes: Bytes,
    e_tag: Option<ETag>,
    last_modified: Option<Timestamp>,
    content_type: Option<ContentType>,
    metadata: Option<Metadata>,
    /// The object's checksums, answered for a GET of all of it (as S3).
    checksums: [Option<String>; 5],
}

impl Held {
    fn new(stamp: (u64, SystemTime), bytes: Bytes, whole: GetObjectOutput) -> Self {
        Self {
            stamp,
            bytes,
            e_tag: whole.e_tag,
            last_modified: whole.last_modified,
            content_type: whole.content_type,
            metadata: whole.metadata,
            checksums: [
                whole.checksum_crc32,
                whole.checksum_crc32c,
                whole.checksum_sha1,
                whole.checksum_sha256,
                whole.checksum_crc64nvme,
            ],
        }
    }

    /// The answer to a GET of `range` (all of the object for `None`).
    fn answer(&self, range: Option<Range>) -> S3Result<GetObjectOutput> {
        let len = self.bytes.len() as u64;
        let span = match range {
            None => 0..len,
            Some(range) => range.check(len)?,
        };
        let content_range = range.map(|_| format!("bytes {}-{}/{len}", span.start, span.end - 1));
        let [crc32, crc32c, sha1, sha256, crc64nvme] = match content_range {
            None => self.checksums.clone(),
            Some(_) => Default::default(),
        };
        let body = self.bytes.slice(span.start as usize..span.end as usize);
        Ok(GetObjectOutput {
            content_length: Some(body.len() as i64),
            body: Some(StreamingBlob::from(s3s::Body::from(body))),
            content_range,
            e_tag: self.e_tag.clone(),
            last_modified: self.last_modified.clone(),
            content_type: self.content_type.clone(),
            metadata: self.metadata.clone(),
            checksum_crc32: crc32,
            checksum_crc32c: crc32c,
            checksum_sha1: sha1,
            checksum_sha256: sha256,
            checksum_crc64nvme: crc64nvme,
            ..Default::default()
        })
    }
}

/// The S3 trait: `get_object` and `head_object` answered by [`Server`],
/// the operations below by s3s-fs, every other one "not implemented".
macro_rules! server_ops {
    ($($op:ident: $input:ident -> $output:ident,)*) => {
        #[async_trait::async_trait]
        impl S3 for Server {
            async fn get_object(
                &self,
                req: S3Request<GetObjectInput>,
            ) -> S3Result<S3Response<GetObjectOutput>> {
                self.get(req).await
            }
            async fn head_object(
                &self,
                req: S3Request<HeadObjectInput>,
            ) -> S3Result<S3Response<HeadObjectOutput>> {
                self.head(req).await
            }
            $(
                async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.fs.$op(req).await
                }
            )*
        }
    };
}

server_ops! {
    list_buckets: ListBucketsInput -> ListBucketsOutput,
    create_bucket: CreateBucketInput -> CreateBucketOutput,
    head_bucket: HeadBucketInput -> HeadBucketOutput,
    delete_bucket: DeleteBucketInput -> DeleteBucketOutput,
    list_objects: ListObjectsInput -> ListObjectsOutput,
    list_objects_v2: ListObjectsV2Input -> ListObjectsV2Output,
    put_object: PutObjectInput -> PutObjectOutput,
    copy_object: CopyObjectInput -> CopyObjectOutput,
    delete_object: DeleteObjectInput -> DeleteObjectOutput,
    delete_objects: DeleteObjectsInput -> DeleteObjectsOutput,
    create_multipart_upload: CreateMultipartUploadInput -> CreateMultipartUploadOutput,
    upload_part: UploadPartInput -> UploadPartOutput,
    complete_multipart_upload: CompleteMultipartUploadInput -> CompleteMultipartUploadOutput,
    abort_multipart_upload: AbortMultipartUploadInput -> AbortMultipartUploadOutput,
}

// One thread: the benchmark's server shares the job's cores.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: streambatch-s3-server <folder> <port> <access key> <secret key> [latency ms]";
    let (root, port, access_key, secret_key, latency_ms) = match args.as_slice() {
        [root, port, access, secret] => (root, port, access, secret, "0"),
        [root, port, access, secret, latency] => (root, port, access, secret, latency.as_str()),
        _ => return Err(usage.into()),
    };
    let latency = std::time::Duration::from_millis(latency_ms.parse()?);
    let root = PathBuf::from(root).canonicalize()?;
    let fs = s3s_fs::FileSystem::new(&root).map_err(|e| format!("{}: {e:?}", root.display()))?;
    let mut service = s3s::service::S3ServiceBuilder::new(Server {
        fs,
        root,
        cache: Mutex::default(),
        latency,
    });
    service.set_auth(s3s::auth::SimpleAuth::from_single(
        access_key.as_str(),
        secret_key.as_str(),
    ));
    let service = service.build();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>()?)).await?;
    let http = Builder::new(TokioExecutor::new());
    loop {
        let (socket, _) = listener.accept().await?;
        let connection = http
            .serve_connection(TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}
