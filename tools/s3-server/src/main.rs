//! An S3-compatible server over a folder, for the W4-from-S3 benchmark:
//! `streambatch-s3-server <folder> <port> <access key> <secret key>`
//! serves the folder's subfolders as buckets on 127.0.0.1:<port>,
//! checking each request's SigV4 signature against the one key pair.
//!
//! It is s3s-fs (the `s3s` crate's file system server) with one change:
//! a GET's bytes are read in one piece and sent as one body, where s3s-fs
//! streams them in reads of 4 KiB, each a trip to tokio's blocking pool
//! (for W4's 1.2 MB row groups, 300 of them a request). The benchmark
//! runs the server on the job's own cores, so what it spends per byte is
//! taken from the job; an S3 service spends it on its own machines.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::dto::*;
use s3s::{S3, S3Request, S3Response, S3Result, s3_error};

/// s3s-fs, its GETs answered in one piece.
struct Server {
    fs: s3s_fs::FileSystem,
    root: PathBuf,
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

    /// s3s-fs answers (its checks, headers and version tag), its body
    /// replaced by the range read at once.
    async fn get(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let path = self.root.join(&req.input.bucket).join(&req.input.key);
        if path.is_dir() {
            return Err(s3_error!(NoSuchKey));
        }
        let range = req.input.range;
        let mut answer = self.fs.get_object(req).await?;
        let read = tokio::task::spawn_blocking(move || read_range(&path, range)).await;
        let bytes = read
            .map_err(|e| s3_error!(InternalError, "{e}"))?
            .map_err(|e| s3_error!(InternalError, "{e}"))?;
        answer.output.body = Some(StreamingBlob::from(s3s::Body::from(bytes)));
        Ok(answer)
    }
}

/// The bytes of `range` of the file at `path` (all of it for `None`).
fn read_range(path: &Path, range: Option<Range>) -> std::io::Result<bytes::Bytes> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let span = match range {
        None => 0..len,
        Some(range) => range
            .check(len)
            .map_err(|_| std::io::Error::other("range not satisfiable"))?,
    };
    file.seek(SeekFrom::Start(span.start))?;
    let mut bytes = vec![0u8; (span.end - span.start) as usize];
    file.read_exact(&mut bytes)?;
    Ok(bytes.into())
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, port, access_key, secret_key] = args.as_slice() else {
        return Err(
            "usage: streambatch-s3-server <folder> <port> <access key> <secret key>".into(),
        );
    };
    let root = PathBuf::from(root).canonicalize()?;
    let fs = s3s_fs::FileSystem::new(&root).map_err(|e| format!("{}: {e:?}", root.display()))?;
    let mut service = s3s::service::S3ServiceBuilder::new(Server { fs, root });
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
