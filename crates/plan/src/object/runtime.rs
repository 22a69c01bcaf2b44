//! The runtime object store requests run on: the `object_store` client is
//! async, the sources are not, so their requests run on two threads of
//! their own, blocked on from the worker threads.

use std::sync::OnceLock;

/// Runs `future` to its end on the object stores' [`runtime`], from any
/// thread, a runtime's included.
pub(crate) fn block_on<F>(future: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    let runtime = runtime();
    match tokio::runtime::Handle::try_current() {
        // A runtime's thread may not block on another: a thread of its own.
        Ok(_) => std::thread::scope(|s| {
            s.spawn(|| runtime.block_on(future))
                .join()
                .expect("an object store request does not panic")
        }),
        Err(_) => runtime.block_on(future),
    }
}

/// The object stores' runtime (two threads, made on first use).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sb-objects")
            .enable_all()
            .build()
            .expect("a runtime for object store requests")
    })
}
