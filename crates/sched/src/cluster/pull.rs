//! A task's inputs held by other nodes, pulled: each holder's on one fetch
//! stream, the holders at once, each slice mapped from shared memory where
//! the holder shares this node's store directory, else sent over QUIC.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use streambatch_core::TaskId;
use streambatch_net::{Fetched, FetchedPart, PartRows, Transport, Want};
use streambatch_plan::Error;

use crate::exec::partition::Slice;
use crate::wire::PartSpec;

/// Inputs this node pulled for the job: by shared memory, over QUIC.
#[derive(Default)]
pub(crate) struct PullCounts {
    pub(crate) shared: AtomicU64,
    pub(crate) quic: AtomicU64,
    pub(crate) quic_bytes: AtomicU64,
}

/// Pulls `pulls` (each with its place in task `task`'s input) from their
/// holders: each holder's on one stream, the holders at once. The first
/// failure is the error, and the other pulls are dropped.
pub(crate) async fn pull_inputs(
    transport: &Transport,
    pulls: Vec<(usize, PartSpec)>,
    counts: &Arc<PullCounts>,
    task: TaskId,
) -> Result<Vec<(usize, Slice)>, Error> {
    let mut by_holder: BTreeMap<String, Vec<(usize, PartSpec)>> = BTreeMap::new();
    for (at, part) in pulls {
        by_holder
            .entry(part.holder.clone())
            .or_default()
            .push((at, part));
    }
    let mut pulling = tokio::task::JoinSet::new();
    for (holder, parts) in by_holder {
        let (transport, counts) = (transport.clone(), counts.clone());
        pulling.spawn(async move {
            let pulled = pull_all(&transport, parts, &counts).await;
            (holder, pulled)
        });
    }
    let mut slices = Vec::new();
    while let Some(done) = pulling.join_next().await {
        let (holder, pulled) = done.unwrap_or_else(|e| {
            let message = format!("pulling a task's input failed: {e}");
            (String::new(), Err(Error::Invalid(message)))
        });
        let ok = pulled.is_ok();
        tracing::debug!(target: "streambatch::pull", task = task.0, holder, ok, "pulled");
        slices.extend(pulled?);
    }
    Ok(slices)
}

/// Pulls one partition from its holder (one a draining node hands over):
/// mapped from shared memory when the holder shares this node's store
/// directory, else over QUIC; with its cut, where asked for
/// (`Want::WithCut`).
pub(crate) async fn pull(
    transport: &Transport,
    part: &PartSpec,
    counts: &PullCounts,
) -> Result<(Slice, Option<Vec<u32>>), Error> {
    let asked = [PartRows {
        partition: part.id,
        want: part.rows,
    }];
    let fetched = transport.fetch_many(&part.holder, &asked).await;
    let mut fetched = fetched.map_err(|e| Error::OnNode {
        node: part.holder.clone(),
        message: format!("fetching partition {}: {e}", part.id),
    })?;
    let mut fetched = fetched.pop().expect("one asked, one answered");
    let cut = fetched.cut.take();
    Ok((slice_of(part, fetched, counts)?, cut))
}

/// Pulls input partitions `parts` (each with its place in the task's
/// input), all of one holder, on one fetch stream (see [`pull`]).
async fn pull_all(
    transport: &Transport,
    parts: Vec<(usize, PartSpec)>,
    counts: &PullCounts,
) -> Result<Vec<(usize, Slice)>, Error> {
    let Some((_, first)) = parts.first() else {
        return Ok(Vec::new());
    };
    let asked: Vec<PartRows> = parts
        .iter()
        .map(|(_, part)| PartRows {
            partition: part.id,
            want: part.rows,
        })
        .collect();
    let fetched = transport.fetch_many(&first.holder, &asked).await;
    let fetched = fetched.map_err(|e| Error::OnNode {
        node: first.holder.clone(),
        message: format!("fetching {} partition(s): {e}", parts.len()),
    })?;
    parts
        .into_iter()
        .zip(fetched)
        .map(|((at, part), fetched)| Ok((at, slice_of(&part, fetched, counts)?)))
        .collect()
}

/// The rows `part` names, from what a fetch of them brought: the rows it
/// asked for, or those the holder found for the group it asked for.
fn slice_of(part: &PartSpec, fetched: FetchedPart, counts: &PullCounts) -> Result<Slice, Error> {
    let failed = |message: String| Error::OnNode {
        node: part.holder.clone(),
        message: format!("fetching partition {}: {message}", part.id),
    };
    let FetchedPart { fetched, rows, .. } = fetched;
    let (batch, alone) = match fetched {
        Fetched::Shared(name, lease) => {
            counts.shared.fetch_add(1, Ordering::Relaxed);
            // The batch holds the lease: the holder keeps the bytes until
            // the last buffer mapping them is gone.
            let batch = streambatch_store::open_shared_keeping(&name, Arc::new(lease))
                .map_err(|e| failed(e.to_string()))?
                .batch;
            // A small part of it is copied out now, which drops the
            // mapping: a mapping holds its fetch stream open (and the
            // holder's pin), and a reducer pulling a slice of every map
            // output would hold one per map output while it pulls the
            // rest, past QUIC's limit of concurrent streams (a stall).
            let slice = within(Slice::fetched(batch), rows).ok_or_else(|| rows_outside(part))?;
            return slice.read_alone().map(Slice::fetched);
        }
        fetched @ (Fetched::Bytes(_) | Fetched::Rows(_)) => {
            let (bytes, alone) = match fetched {
                Fetched::Rows(bytes) => (bytes, true),
                Fetched::Bytes(bytes) => (bytes, false),
                Fetched::Shared(..) => unreachable!("matched above"),
            };
            counts.quic.fetch_add(1, Ordering::Relaxed);
            counts
                .quic_bytes
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            let batch = streambatch_store::ipc::decode_unaligned(&bytes)
                .map_err(|e| failed(e.to_string()))?;
            (batch, alone)
        }
    };
    // The rows alone are the slice itself: as many as asked (or as the
    // holder said its group holds), or the holder's answer is wrong.
    match (alone, rows) {
        (true, Some(rows)) if batch.num_rows() as u64 == rows.len => Ok(Slice::fetched(batch)),
        (true, _) => Err(rows_outside(part)),
        (false, rows) => within(Slice::fetched(batch), rows).ok_or_else(|| rows_outside(part)),
    }
}

/// Rows `rows` of `slice` (all of it for `None`), when it has them.
fn within(slice: Slice, rows: Option<streambatch_net::RowRange>) -> Option<Slice> {
    match rows {
        Some(rows) => slice.sub_within(rows.offset, rows.len),
        None => Some(slice),
    }
}

/// The error of rows `part` names that its partition does not have.
pub(crate) fn rows_outside(part: &PartSpec) -> Error {
    let rows = match part.rows {
        Want::Whole | Want::WithCut => "its rows are".to_string(),
        Want::Rows(rows) => format!("rows {}..+{} are", rows.offset, rows.len),
        Want::Group(d) => format!("destination {d}'s rows are"),
    };
    Error::OnNode {
        node: part.holder.clone(),
        message: format!("{rows} outside partition {}", part.id),
    }
}
