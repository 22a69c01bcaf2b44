//! Object stores (`s3://`, `gs://`, `az://`, `http(s)://`): files read by
//! ranges, objects written by multipart uploads, the manifest that commits
//! a folder (and, for a local folder, the record of a commit in progress
//! that readers and writers finish), credentials from the AWS profile files, the runtime their
//! requests run on, and the first bytes of tasks to come fetched ahead.
//!
//! It imports nothing of the crate but `error`: the readers (`read`) and
//! writers (`sink`) above it decide what to fetch and store.

pub(crate) mod aws_profile;
pub(crate) mod files;
pub(crate) mod local_commit;
pub(crate) mod manifest;
pub(crate) mod read_ahead;
pub(crate) mod runtime;
pub(crate) mod writes;
