//! W6, training ingest (docs/workloads.md): one streaming job per epoch
//! split equally between two trainer processes (this binary, started by
//! the workload: [`w6_trainer`]), each reading its rank for 2 epochs in
//! batches of 64 (W6a through a 1,000-row shuffle window), a fixed sleep
//! per batch standing for a GPU step.
//! - W6a, real CPU ([`w6a`]): 8,000 seeded 256x256 JPEGs decoded, cropped
//!   to 224 and flipped on the embedded node, normalised to f32 by each
//!   trainer's collate, after its shuffle window ([`normalize`]): a
//!   window of 1,000 f32 rows holds up to 574 MiB a rank.
//! - W6b, logical slots ([`w6b`]): N CPU-only node processes (8 slots each)
//!   whose decode is a fixed sleep per image feed the driver that serves
//!   the trainers; ideal, the lower of N nodes' rate and the trainers'.
//!
//! The driver checks that every image of each epoch reached a trainer once
//! and that no trainer found a wrong row (see the trainer for what it
//! checks), and prints the result line:
//! `images_per_s`, each rank's `trainer_wait_fraction`, `correct`.

mod trainer;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use rand::{Rng, SeedableRng};
use streambatch::{
    Context, Dataset, Error, NodeConfig, Resources, Result, Split, SplitOptions, TlsFiles, UdfError,
};
use streambatch_split::SplitService;
use trainer::TrainerSpec;
pub use trainer::w6_trainer;

use crate::nodes::{NodeProcess, failed, node_config, start_node};
use crate::{BenchResult, IdSet, registry};

/// W6a's images.
pub const W6A_IMAGES: usize = 8_000;
/// W6a's trainer step per batch by default, in milliseconds: see
/// docs/workloads.md for how it was chosen.
pub const W6A_STEP_MS: u64 = 110;
/// W6a's store by default: the job runs at most this far ahead of the
/// trainers, who are the bound (about 1,700 cropped images, 1.5 s of their
/// steps); a larger store only fills.
pub const W6A_STORE_CAP: u64 = 256 << 20;
/// W6b's images per epoch.
pub const W6B_IMAGES: usize = 1_536;
/// Bytes of a W6b image (224 x 224 x 3).
pub(crate) const W6B_IMAGE_BYTES: usize = 224 * 224 * 3;
/// W6b's decode: milliseconds per image, on one of 8 CPU slots per node
/// (200 images/s a node).
const W6B_DECODE_MS: u64 = 40;
/// W6b's images per source partition (a 160 ms decode task).
const W6B_PARTITION: usize = 4;
/// W6b's trainers' bound, both ranks together.
const W6B_TRAINERS_PER_S: f64 = 600.0;

const RANKS: usize = 2;
const EPOCHS: usize = 2;
pub(crate) const BATCH: usize = 64;
pub(crate) const SHUFFLE_ROWS: usize = 1_000;
pub(crate) const SEED: u64 = 7;
pub(crate) const SIDE: u32 = 224;
pub(crate) const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub(crate) const STD: [f32; 3] = [0.229, 0.224, 0.225];
/// The lowest and highest value normalising a byte gives, over the
/// channels (with a little room for rounding).
pub(crate) const NORMALISED_RANGE: (f32, f32) = (-2.1180, 2.6401);

/// What a trainer checks in each row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowCheck {
    /// W6a: `path` (its image's number) and `pixels`, normalised f32.
    Pixels,
    /// W6b: `id` and `data`, [`W6B_IMAGE_BYTES`] of the id's byte.
    Filled,
}

impl RowCheck {
    fn name(self) -> &'static str {
        match self {
            Self::Pixels => "pixels",
            Self::Filled => "filled",
        }
    }

    fn named(name: &str) -> Option<Self> {
        [Self::Pixels, Self::Filled]
            .into_iter()
            .find(|c| c.name() == name)
    }
}

/// The number of image `img-01234.jpg`.
pub(crate) fn image_id(path: &str) -> Option<i64> {
    let name = Path::new(path).file_stem()?.to_str()?;
    name.strip_prefix("img-")?.parse().ok()
}

/// Writes `n` seeded 256x256 JPEGs `img-NNNNN.jpg` into `dir` (gradients
/// with a tint and a pattern of their own), unless the last one is there.
pub fn make_jpegs(dir: &Path, n: usize, seed: u64) -> Result<()> {
    let last = dir.join(format!("img-{:05}.jpg", n.saturating_sub(1)));
    if n == 0 || last.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    for i in 0..n {
        let mixed: [u8; 3] = rand::rngs::StdRng::seed_from_u64(seed ^ i as u64).random();
        let image = image::RgbImage::from_fn(256, 256, |x, y| {
            let noise = ((x * 7 + y * 13 + i as u32 * 31) % 17) as u8;
            image::Rgb([
                (x as u8).wrapping_add(mixed[0]) ^ noise,
                (y as u8).wrapping_add(mixed[1]),
                ((x + y) as u8).wrapping_add(mixed[2]),
            ])
        });
        let path = dir.join(format!("img-{i:05}.jpg"));
        let tmp = dir.join(format!(".img-{i:05}.jpg.tmp"));
        image
            .save_with_format(&tmp, image::ImageFormat::Jpeg)
            .map_err(|e| Error::Invalid(format!("writing {}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io("renaming into", &path, e))?;
    }
    Ok(())
}

/// The job's operators for `epoch`: random resized crop to 224 and flip,
/// seeded by the epoch and each image's path.
#[allow(clippy::type_complexity)]
fn crop_and_flip(
    epoch: u64,
) -> (
    impl Fn(RecordBatch) -> std::result::Result<RecordBatch, UdfError> + Clone + Send + Sync + 'static,
    impl Fn(RecordBatch) -> std::result::Result<RecordBatch, UdfError> + Clone + Send + Sync + 'static,
) {
    use streambatch::ops;
    let side = (SIDE, SIDE);
    (
        ops::random_resized_crop((256, 256), side, (0.08, 1.0), SEED, epoch),
        ops::flip(side, 0.5, SEED, epoch),
    )
}

/// The image pipeline of epoch `epoch` over the JPEGs in `dir`: decode,
/// crop and flip (bytes); the trainers normalise each batch (their
/// collate).
pub fn augmented(ctx: &Context, dir: &str, epoch: u64) -> Result<Dataset> {
    let cpu = || Resources::cpu(1.0);
    let (crop, flip) = crop_and_flip(epoch);
    Ok(ctx
        .read_images(dir, 256, 256)?
        .map_batches(crop, cpu())
        .named("crop")
        .map_batches(flip, cpu())
        .named("flip"))
}

/// W6a's last operator, normalising bytes to f32: a trainer's collate,
/// applied to each batch after the shuffle window, so the window holds
/// the crops' bytes (a quarter of the f32 rows).
pub(crate) fn normalize()
-> impl Fn(RecordBatch) -> std::result::Result<RecordBatch, UdfError> + Send + Sync + 'static {
    streambatch::ops::normalize((SIDE, SIDE), MEAN, STD)
}

/// The whole pipeline of `epoch` (crop, flip, normalise) applied to one
/// batch of `read_images` rows, outside any job: what a trainer checks a
/// row against.
fn augment_batch(batch: RecordBatch, epoch: u64) -> std::result::Result<RecordBatch, UdfError> {
    let (crop, flip) = crop_and_flip(epoch);
    normalize()(flip(crop(batch)?)?)
}

fn split_options() -> SplitOptions {
    SplitOptions {
        equal: true,
        block_order_seed: Some(SEED),
        epochs: Some(EPOCHS),
        ..SplitOptions::default()
    }
}

/// W6a: [`augmented`] over [`W6A_IMAGES`] JPEGs in `input` (made if
/// absent) on an embedded node of `base`'s settings, split between two
/// trainer processes whose step is `step` per batch.
pub fn w6a(input: &Path, step: Duration, base: &NodeConfig) -> Result<BenchResult> {
    make_jpegs(input, W6A_IMAGES, SEED)?;
    // Splits of about 8 MiB decoded (42 images; about 6 MiB cropped): a
    // training stream moves in small steps.
    let config = NodeConfig {
        target_partition_bytes: base.target_partition_bytes.min(8 << 20),
        ..base.clone()
    };
    let ctx = Context::with_config(config)?;
    let tls = base.spill_dir.join("w6a-tls");
    certificates(&tls)?;
    let dir = input.display().to_string();
    let plan_ctx = ctx.clone();
    // From before the split: its first epoch's job starts with it.
    let started = Instant::now();
    let splits = Split::per_epoch(RANKS, split_options(), move |epoch| {
        augmented(&plan_ctx, &dir, epoch as u64)
    })?;
    let run = trained(
        splits,
        started,
        &tls,
        (step, SHUFFLE_ROWS),
        RowCheck::Pixels,
        W6A_IMAGES,
    )?;
    let config = format!("step_ms={}", step.as_millis());
    Ok(run.result("w6a", config, &ctx.store_stats(), None))
}

/// W6b with `n` CPU-only nodes: [`W6B_IMAGES`] an epoch, each "decoded" by
/// a [`W6B_DECODE_MS`] sleep on one of a node's 8 CPU slots, split between
/// two trainers beside the driver whose step makes them the bound at
/// [`W6B_TRAINERS_PER_S`]; `dir` holds the cluster's files.
pub fn w6b(n: usize, dir: &Path) -> Result<BenchResult> {
    let dir = dir.join(format!("w6b-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
    let exe = std::env::current_exe().map_err(|e| Error::io("finding", "this program", e))?;
    let cpu_names: Vec<String> = (1..=n).map(|i| format!("cpu-{i}")).collect();
    let mut names = vec!["head", "driver", "trainer-0", "trainer-1"];
    names.extend(cpu_names.iter().map(String::as_str));
    streambatch::init_cluster(&dir.join("tls"), &names)
        .map_err(|e| failed(format!("certificates: {e}")))?;
    let head_config = node_config(&dir, "head", None, (0, 0), None);
    let head = start_node(&exe, &dir, &head_config, "head")?;
    let mut nodes: Vec<NodeProcess> = vec![];
    for name in &cpu_names {
        let config = node_config(&dir, name, Some(&head.addr), (8, 0), None);
        nodes.push(start_node(&exe, &dir, &config, name)?);
    }
    node_config(&dir, "driver", Some(&head.addr), (0, 0), None);
    let ctx = Context::connect(dir.join("driver.toml"))?;
    let decode = registry().udf(
        "w6b.decode",
        &crate::shaped::params(W6B_DECODE_MS, W6B_IMAGE_BYTES as u64),
    )?;
    let plan_ctx = ctx.clone();
    let started = Instant::now();
    let splits = Split::per_epoch(RANKS, split_options(), move |_| {
        let source = plan_ctx.range(W6B_IMAGES as u64, W6B_IMAGES / W6B_PARTITION);
        Ok(source
            .map_batches(decode.clone(), Resources::cpu(1.0))
            .named("decode"))
    })?;
    let step = Duration::from_secs_f64((RANKS * BATCH) as f64 / W6B_TRAINERS_PER_S);
    // No shuffle window: W6b measures scaling, and a window's last rows
    // (a window a rank, let go when the input ends) would be a drain at
    // every N's end where the decoding nodes idle.
    let run = trained(
        splits,
        started,
        &dir.join("tls"),
        (step, 0),
        RowCheck::Filled,
        W6B_IMAGES,
    )?;
    let nodes_rss: f64 = nodes
        .iter()
        .chain([&head])
        .map(NodeProcess::peak_rss_mib)
        .sum();
    let decode_per_s = n as f64 * 8.0 * 1000.0 / W6B_DECODE_MS as f64;
    let ideal_per_s = decode_per_s.min(W6B_TRAINERS_PER_S);
    let mut result = run.result(
        "w6b",
        format!("nodes={n}"),
        &Default::default(),
        Some(nodes_rss),
    );
    let ideal = Duration::from_secs_f64((EPOCHS * W6B_IMAGES) as f64 / ideal_per_s);
    result.ideal = Some(ideal);
    result.extra.push(("nodes".into(), n.into()));
    result
        .extra
        .push(("ideal_images_per_s".into(), ideal_per_s.into()));
    Ok(result)
}

/// What the trainers reported.
struct Trained {
    wall: Duration,
    images: usize,
    /// Per rank, the share of its time it waited for data.
    wait_fraction: Vec<f64>,
    /// Per rank, the seconds it waited for data in each epoch.
    waits: Vec<Vec<f64>>,
    /// Every image of each epoch once, and no wrong value.
    correct: bool,
    step: Duration,
    /// The trainers' peak memory, summed.
    trainers_rss_mib: f64,
    /// Per rank, pieces it got from the driver and from the nodes
    /// holding them.
    pieces: Vec<(u64, u64)>,
}

impl Trained {
    fn result(
        &self,
        workload: &str,
        config: String,
        store: &streambatch::StoreStats,
        nodes_rss_mib: Option<f64>,
    ) -> BenchResult {
        let mut result = BenchResult::new(
            workload,
            config,
            self.wall,
            self.images as u64,
            &Default::default(),
            store,
            self.correct,
        );
        let rss = crate::peak_rss_mib().unwrap_or(0.0)
            + self.trainers_rss_mib
            + nodes_rss_mib.unwrap_or(0.0);
        let per_s = self.images as f64 / self.wall.as_secs_f64();
        let trainers_per_s = (RANKS * BATCH) as f64 / self.step.as_secs_f64();
        result.extra = vec![
            ("images_per_s".into(), crate::round(per_s).into()),
            (
                "trainer_wait_fraction".into(),
                self.wait_fraction
                    .iter()
                    .map(|f| crate::round(*f))
                    .collect(),
            ),
            ("trainer_wait_s_by_epoch".into(), self.waits.clone().into()),
            (
                "trainers_bound_images_per_s".into(),
                crate::round(trainers_per_s).into(),
            ),
            (
                "step_ms".into(),
                crate::round(self.step.as_secs_f64() * 1e3).into(),
            ),
            ("peak_rss_mib".into(), crate::round(rss).into()),
            (
                "pieces_from_driver".into(),
                self.pieces.iter().map(|p| p.0).collect::<Vec<_>>().into(),
            ),
            (
                "pieces_from_nodes".into(),
                self.pieces.iter().map(|p| p.1).collect::<Vec<_>>().into(),
            ),
        ];
        result
    }
}

/// Makes the driver's and trainers' certificates in `tls` unless there.
fn certificates(tls: &Path) -> Result<()> {
    if !tls.join("trainer-1.pem").exists() {
        streambatch::init_cluster(tls, &["driver", "trainer-0", "trainer-1"])
            .map_err(|e| failed(format!("certificates: {e}")))?;
    }
    Ok(())
}

/// A trainer process, killed if dropped before it was waited for.
struct TrainerProcess {
    child: std::process::Child,
    lines: Option<std::thread::JoinHandle<Vec<serde_json::Value>>>,
}

impl Drop for TrainerProcess {
    fn drop(&mut self) {
        if self.lines.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Serves `splits` (made at `started`, the run's start) to two trainer
/// processes holding certificates in `tls` that step `step` per batch with
/// a shuffle window of `shuffle_rows` and check rows as `rows` says; waits
/// for them and checks that each epoch's `images` each came once.
fn trained(
    splits: Vec<Split>,
    started: Instant,
    tls: &Path,
    (step, shuffle_rows): (Duration, usize),
    rows: RowCheck,
    images: usize,
) -> Result<Trained> {
    let service = SplitService::start(
        splits,
        &TlsFiles::in_dir(tls, "driver"),
        "127.0.0.1:0".parse().expect("an address"),
    )?;
    let exe = std::env::current_exe().map_err(|e| Error::io("finding", "this program", e))?;
    let trainers: Vec<TrainerProcess> = service
        .handles()
        .iter()
        .cloned()
        .map(|handle| {
            let spec = TrainerSpec {
                name: format!("trainer-{}", handle.rank),
                handle,
                tls_dir: tls.to_path_buf(),
                epochs: EPOCHS,
                step,
                shuffle_rows,
                rows,
            };
            let mut child = Command::new(&exe)
                .args(["bench", "w6a", "--trainer"])
                .arg(spec.to_json())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| Error::io("starting a trainer from", &exe, e))?;
            let stdout = child.stdout.take().expect("piped");
            // Read as it comes, so that a full pipe never holds a trainer.
            let lines = std::thread::spawn(move || {
                BufReader::new(stdout)
                    .lines()
                    .map_while(std::result::Result::ok)
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
                    .collect::<Vec<_>>()
            });
            Ok(TrainerProcess {
                child,
                lines: Some(lines),
            })
        })
        .collect::<Result<_>>()?;
    let mut reports = Vec::new();
    let mut exited_well = true;
    for mut trainer in trainers {
        let status = trainer
            .child
            .wait()
            .map_err(|e| Error::io("waiting for", "a trainer", e))?;
        exited_well &= status.success();
        let lines = trainer.lines.take().expect("taken once");
        reports.push(lines.join().unwrap_or_default());
    }
    let wall = started.elapsed();
    let mut epochs: Vec<IdSet> = (0..EPOCHS).map(|_| IdSet::new(images as u64)).collect();
    let (mut wrong, mut delivered, mut rss) = (0, 0, 0.0);
    let (mut wait_fraction, mut waits, mut pieces) = (vec![], vec![], vec![]);
    for lines in &reports {
        let (mut took, mut waited, mut by_epoch) = (0.0, 0.0, vec![]);
        for line in lines {
            rss += line["peak_rss_mib"].as_f64().unwrap_or(0.0);
            if let Some(driver) = line["pieces_from_driver"].as_u64() {
                pieces.push((driver, line["pieces_from_nodes"].as_u64().unwrap_or(0)));
            }
            let Some(epoch) = line["epoch"].as_u64() else {
                continue;
            };
            took += line["took_s"].as_f64().unwrap_or(0.0);
            waited += line["waited_s"].as_f64().unwrap_or(0.0);
            by_epoch.push(crate::round(line["waited_s"].as_f64().unwrap_or(0.0)));
            wrong += line["wrong_rows"].as_u64().unwrap_or(0);
            let ids = line["ids"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            delivered += ids.len();
            if let Some(set) = epochs.get_mut(epoch as usize) {
                ids.iter().for_each(|id| set.add(id.as_i64().unwrap_or(-1)));
            }
        }
        wait_fraction.push(if took > 0.0 { waited / took } else { 1.0 });
        waits.push(by_epoch);
    }
    let every_image_once = epochs.iter().all(IdSet::each_once);
    if !every_image_once || wrong > 0 || !exited_well {
        eprintln!(
            "w6: trainers exited well: {exited_well}; wrong rows: {wrong}; per epoch (rows, distinct) of {images}: {:?}",
            epochs
                .iter()
                .map(|s| (s.rows(), s.distinct()))
                .collect::<Vec<_>>()
        );
    }
    Ok(Trained {
        wall,
        images: delivered,
        wait_fraction,
        waits,
        correct: every_image_once && wrong == 0 && exited_well,
        step,
        trainers_rss_mib: rss,
        pieces,
    })
}
