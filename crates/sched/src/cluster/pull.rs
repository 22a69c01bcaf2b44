//! A task's inputs: those held here sliced from the store, those held by
//! other nodes pulled (each holder's on one fetch stream, the holders at
//! once, each slice mapped from shared memory where the holder shares this
//! node's store directory, else sent over QUIC), and a hash exchange
//! reducer's checked against the rows the cuts said it reads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use streambatch_core::TaskId;
use streambatch_net::{Fetched, FetchedPart, PartRows, Transport, Want};
use streambatch_plan::{Blob, Error};

use crate::exec::partitioner::{Output, Slice};
use crate::job::Part;
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
    let mut fetched = fetch(transport, std::slice::from_ref(part)).await?;
    let mut fetched = fetched.pop().expect("one asked, one answered");
    let cut = fetched.cut.take();
    Ok((slice_of(part, fetched, counts)?, cut))
}

/// Fetches `parts`, all of one holder, on one stream: an answer for each.
async fn fetch(transport: &Transport, parts: &[PartSpec]) -> Result<Vec<FetchedPart>, Error> {
    let Some(first) = parts.first() else {
        return Ok(Vec::new());
    };
    let asked: Vec<PartRows> = parts
        .iter()
        .map(|part| PartRows {
            partition: part.id,
            want: part.want,
        })
        .collect();
    let fetched = transport.fetch_many(&first.holder, &asked).await;
    fetched.map_err(|e| Error::OnNode {
        node: first.holder.clone(),
        message: format!("fetching {} partition(s): {e}", parts.len()),
    })
}

/// Pulls input partitions `parts` (each with its place in the task's
/// input), all of one holder, on one fetch stream (see [`pull`]).
async fn pull_all(
    transport: &Transport,
    parts: Vec<(usize, PartSpec)>,
    counts: &PullCounts,
) -> Result<Vec<(usize, Slice)>, Error> {
    let (places, parts): (Vec<usize>, Vec<PartSpec>) = parts.into_iter().unzip();
    let fetched = fetch(transport, &parts).await?;
    places
        .into_iter()
        .zip(parts.iter().zip(fetched))
        .map(|(at, (part, fetched))| Ok((at, slice_of(part, fetched, counts)?)))
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
    let rows = match part.want {
        Want::Whole | Want::WithCut => "its rows are".to_string(),
        Want::Rows(rows) => format!("rows {}..+{} are", rows.offset, rows.len),
        Want::Group(d) => format!("destination {d}'s rows are"),
    };
    Error::OnNode {
        node: part.holder.clone(),
        message: format!("{rows} outside partition {}", part.id),
    }
}

/// The rows `part` names of `output`, held here: `None` when it does not
/// have them.
pub(crate) fn local_rows(output: &Arc<Output>, part: &PartSpec) -> Option<Slice> {
    let whole = Slice::whole(output.clone());
    match part.want {
        Want::Whole | Want::WithCut => Some(whole),
        Want::Rows(rows) => whole.sub_within(rows.offset, rows.len),
        Want::Group(d) => {
            Some(Part::group(&whole, d as usize)).filter(|s| s.destination().is_none())
        }
    }
}

/// Whether `slices`, a hash exchange reducer's input as its holders found
/// it, hold the `rows` the map outputs' cuts said they would.
pub(crate) fn found_all(
    task: TaskId,
    slices: &[(usize, Slice)],
    rows: Option<u64>,
) -> Result<(), Error> {
    let found: usize = slices.iter().map(|(_, slice)| slice.len).sum();
    match rows {
        Some(rows) if rows != found as u64 => Err(Error::Invalid(format!(
            "task {}: the holders of its input found {found} rows of its destination, \
             where the map outputs' cuts held {rows}",
            task.0
        ))),
        _ => Ok(()),
    }
}

/// The blobs `sha256s` of a job's recipes (see `streambatch_plan::Blob`):
/// those this process holds already, the rest pulled from the job's driver,
/// each checked against its hash. Held by the caller while it rebuilds the
/// plan, whose operators then keep them.
pub(crate) async fn pull_blobs(
    transport: &Transport,
    driver: &str,
    sha256s: &[String],
) -> Result<Vec<Blob>, String> {
    let mut held = Vec::with_capacity(sha256s.len());
    for sha256 in sha256s {
        if let Some(blob) = Blob::find(sha256) {
            held.push(blob);
            continue;
        }
        let why = |reason: String| format!("blob {sha256} from driver {driver}: {reason}");
        let bytes = match transport.fetch(driver, Blob::id_of(sha256)).await {
            Ok(Fetched::Bytes(bytes)) => bytes,
            Ok(_) => return Err(why("the driver answered with other than its bytes".into())),
            Err(e) => return Err(why(e.to_string())),
        };
        let blob = Blob::new(bytes.into());
        if blob.sha256() != sha256 {
            return Err(why(format!(
                "what arrived has SHA-256 {}: refused",
                blob.sha256()
            )));
        }
        held.push(blob);
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use arrow_array::RecordBatch;
    use streambatch_store::ObjectStore;

    use super::*;
    use crate::cluster::serve::StoreServer;

    /// A reducer's destination of a map output is found by the cut the
    /// holder's store keeps with it: read here, or served to a peer. No
    /// cut, or no such destination, is refused.
    #[test]
    fn a_destination_is_found_by_the_cut_its_holders_store_keeps() {
        use arrow_array::{ArrayRef, Int64Array};
        use streambatch_net::{PartitionServer, RowRange};
        use streambatch_store::{SharedStore, StoreConfig};

        let dir = tempfile::tempdir().unwrap();
        let store =
            SharedStore::open(StoreConfig::new(16 << 20, dir.path().join("spill"))).unwrap();
        let x: ArrayRef = Arc::new(Int64Array::from_iter_values(0..10));
        let batch = RecordBatch::try_from_iter([("x", x)]).unwrap();
        let grouped = store.put_grouped(batch.clone(), &[0, 3, 3, 10]).unwrap();
        let plain = store.put(batch.clone()).unwrap();
        let server = StoreServer::new(store.clone());
        let (grouped_id, plain_id) = (grouped.id().0, plain.id().0);
        server.offer(grouped.clone());
        server.offer(plain.clone());
        let grouped = Output::new(grouped, 80, None);
        let plain = Output::new(plain, 80, None);
        let group = |output: &Arc<Output>, d| {
            let spec = PartSpec {
                holder: "node".into(),
                id: output.part().id().0,
                want: Want::Group(d),
            };
            local_rows(output, &spec).map(|slice| slice.read().unwrap())
        };
        assert_eq!(group(&grouped, 0), Some(batch.slice(0, 3)));
        assert_eq!(group(&grouped, 1), Some(batch.slice(3, 0)));
        assert_eq!(group(&grouped, 2), Some(batch.slice(3, 7)));
        assert_eq!(group(&grouped, 3), None, "cut into 3");
        assert_eq!(group(&plain, 0), None, "kept no cut");
        let range = |offset, len| RowRange { offset, len };
        assert_eq!(server.group_rows(grouped_id, 2), Ok(range(3, 7)));
        let refused = server.group_rows(grouped_id, 3).unwrap_err();
        assert!(refused.contains("no destination 3"), "{refused}");
        let refused = server.group_rows(plain_id, 0).unwrap_err();
        assert!(refused.contains("not kept cut into groups"), "{refused}");
    }

    /// A hash exchange's reducer whose holders found other rows than the
    /// map outputs' cuts held fails, not runs on them.
    #[test]
    fn a_reducer_fails_where_its_holders_found_other_rows_than_the_cuts_held() {
        use arrow_array::{ArrayRef, Int64Array};

        let slice = |at, n| {
            let x: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n));
            (
                at,
                Slice::fetched(RecordBatch::try_from_iter([("x", x)]).unwrap()),
            )
        };
        let slices = [slice(0, 3), slice(1, 0), slice(2, 4)];
        assert!(found_all(TaskId(5), &slices, Some(7)).is_ok());
        assert!(found_all(TaskId(5), &slices, None).is_ok(), "not a reducer");
        let err = found_all(TaskId(5), &slices, Some(8))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("task 5") && err.contains("found 7 rows"),
            "{err}"
        );
        assert!(err.contains("held 8"), "{err}");
    }
}
