//! Each task runs inside a `tracing` span naming its job, stage, task and
//! node, so that `RUST_LOG` output and any subscriber can tell tasks apart.

mod common;

use std::sync::{Arc, Mutex};

use common::ctx;
use streambatch::prelude::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};

/// A span's fields, as (name, value) in order.
type SpanFields = Vec<(String, String)>;

/// The fields of every `task` span opened.
#[derive(Clone, Default)]
struct TaskSpans(Arc<Mutex<Vec<SpanFields>>>);

struct Fields(SpanFields);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .push((field.name().to_string(), format!("{value:?}")));
    }
}

impl<S: tracing::Subscriber> Layer<S> for TaskSpans {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: LayerContext<'_, S>) {
        if attrs.metadata().name() == "task" {
            let mut fields = Fields(Vec::new());
            attrs.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
    }
}

#[test]
fn every_task_runs_in_a_span_naming_job_stage_task_and_node() {
    let spans = TaskSpans::default();
    // Global: tasks run on the node's worker threads.
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(spans.clone()))
        .unwrap();
    let rows = ctx()
        .range(100, 4)
        .map_batches(|b: RecordBatch| Ok::<_, UdfError>(b), Resources::cpu(1.0))
        .named("noop")
        .count()
        .unwrap();
    assert_eq!(rows, 100);

    let spans = spans.0.lock().unwrap();
    assert_eq!(spans.len(), 4, "one span per task: {spans:?}");
    let mut tasks: Vec<&str> = Vec::new();
    for fields in spans.iter() {
        let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["job", "stage", "task", "node"], "{fields:?}");
        let value = |key: &str| fields.iter().find(|(k, _)| k == key).unwrap().1.as_str();
        assert!(value("job").starts_with("job-"), "{fields:?}");
        assert_eq!(value("stage"), "range->noop");
        assert_eq!(value("node"), "node-0");
        tasks.push(value("task"));
    }
    tasks.sort();
    tasks.dedup();
    assert_eq!(tasks.len(), 4, "each task once: {tasks:?}");
}
