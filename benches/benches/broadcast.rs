//! Fan-out throughput: one writer, 1/4/16 readers, 16- and 128-byte messages.
//! `expiremap::broadcast`, `tokio::sync::broadcast` (used synchronously) and
//! one `crossbeam-channel` per reader, in one run, on the same inputs.
//!
//! Run: `cargo bench --bench broadcast`
//!
//! One iteration sends `MESSAGES` messages and ends when every reader has
//! seen `Closed`. The readers are spawned and waiting at a barrier before the
//! clock starts. Every reader uses its library's blocking receive.
//!
//! Flow control: the broadcast rings (ours, tokio) are lossy and never make
//! the writer wait. Unpaced, a writer outruns its readers and most messages
//! are skipped (about 93% in a trial run on 2 cores), which times the writer,
//! not the fan-out. So every library gets the same harness pacing. Each
//! reader publishes how many messages it has handled, and the writer checks
//! every `PACE` messages that it stays less than `CAPACITY - PACE` ahead of
//! the slowest reader, yielding otherwise. Nothing is lost then, and the bench
//! prints the delivered fraction at the end to prove it. Crossbeam's bounded
//! channels are lossless anyway.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use expiremap_benches::SplitMix64;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const MESSAGES: usize = 20_000;
const CAPACITY: usize = 1024;
const READERS: [usize; 3] = [1, 4, 16];
/// The writer checks the readers' progress every `PACE` messages.
const PACE: usize = 64;

/// One reader's progress counter, on its own cache line.
#[repr(align(128))]
#[derive(Default)]
struct Progress(AtomicU64);

/// The harness's flow control, the same for every library.
struct Flow(Vec<Progress>);

impl Flow {
    fn new(readers: usize) -> Arc<Self> {
        Arc::new(Self((0..readers).map(|_| Progress::default()).collect()))
    }

    /// Reader `i` has handled `n` messages (received or skipped).
    #[inline]
    fn done(&self, i: usize, n: u64) {
        self.0[i].0.store(n, Ordering::Release);
    }

    /// Called by the writer before sending message `sent`.
    #[inline]
    fn pace(&self, sent: usize) {
        if sent % PACE != 0 {
            return;
        }
        let limit = (sent + PACE).saturating_sub(CAPACITY) as u64;
        while self.0.iter().any(|p| p.0.load(Ordering::Acquire) < limit) {
            thread::yield_now();
        }
    }
}

/// `(case, messages delivered, messages expected)`, summed over the run.
static DELIVERY: Mutex<Vec<(String, u64, u64)>> = Mutex::new(Vec::new());

fn record(case: &str, delivered: u64, expected: u64) {
    let mut d = DELIVERY.lock().unwrap();
    match d.iter_mut().find(|(c, _, _)| c == case) {
        Some(e) => {
            e.1 += delivered;
            e.2 += expected;
        }
        None => d.push((case.to_string(), delivered, expected)),
    }
}

/// The same `MESSAGES` messages of `N` bytes for every library.
fn inputs<const N: usize>() -> Arc<Vec<[u8; N]>> {
    let mut rng = SplitMix64(0xB0AD_CA57);
    let msgs = (0..MESSAGES)
        .map(|_| {
            let mut m = [0u8; N];
            for chunk in m.chunks_mut(8) {
                let r = rng.next_u64().to_le_bytes();
                chunk.copy_from_slice(&r[..chunk.len()]);
            }
            m
        })
        .collect();
    Arc::new(msgs)
}

/// Runs one fan-out: `spawn_reader(i)` makes reader `i`'s body (run after
/// the barrier, returns messages received); `write` sends everything and
/// drops the senders. Returns the time from the first send to the last
/// reader's `Closed`.
fn run_once(
    case: &str,
    readers: usize,
    mut spawn_reader: impl FnMut(usize) -> Box<dyn FnOnce() -> u64 + Send>,
    write: impl FnOnce(),
) -> Duration {
    let barrier = Arc::new(Barrier::new(readers + 1));
    let handles: Vec<_> = (0..readers)
        .map(|i| {
            let body = spawn_reader(i);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                body()
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    write();
    let delivered: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let elapsed = start.elapsed();
    record(case, delivered, (readers * MESSAGES) as u64);
    elapsed
}

/// How `expiremap` readers receive in a run.
#[derive(Clone, Copy)]
enum Mode {
    /// Blocking `recv`, one message per call (one CAS pair per message).
    Recv,
    /// `try_recv_batch` of up to 64 (one CAS pair per batch), falling back
    /// to a blocking `recv` when nothing is available.
    Batch,
}

fn ours<const N: usize>(msgs: &Arc<Vec<[u8; N]>>, readers: usize, mode: Mode) -> Duration {
    // The sender must be dropped inside the timed region for readers to see
    // Closed, so it is moved into the write closure.
    let tx = expiremap::broadcast::Sender::<[u8; N]>::new(CAPACITY, readers).unwrap();
    let rxs: Vec<_> = (0..readers).map(|_| tx.subscribe().unwrap()).collect();
    let mut rxs = rxs.into_iter();
    let name = match mode {
        Mode::Recv => "expiremap",
        Mode::Batch => "expiremap-batch",
    };
    let case = format!("{name}/{readers}r/{N}B");
    let msgs = Arc::clone(msgs);
    let flow = Flow::new(readers);
    let wflow = Arc::clone(&flow);
    run_once(
        &case,
        readers,
        |i| {
            let mut rx = rxs.next().unwrap();
            let flow = Arc::clone(&flow);
            Box::new(move || {
                let (mut got, mut seen) = (0, 0);
                let mut batch = Vec::with_capacity(64);
                loop {
                    if let Mode::Batch = mode {
                        batch.clear();
                        if let Ok(n) = rx.try_recv_batch(&mut batch, 64) {
                            for m in batch.drain(..) {
                                black_box(m);
                            }
                            got += n as u64;
                            seen += n as u64;
                            flow.done(i, seen);
                            continue;
                        }
                    }
                    match rx.recv() {
                        Ok(m) => {
                            black_box(m);
                            got += 1;
                            seen += 1;
                        }
                        Err(expiremap::broadcast::RecvError::Lagged(n)) => seen += n,
                        Err(expiremap::broadcast::RecvError::Closed) => return got,
                    }
                    flow.done(i, seen);
                }
            })
        },
        move || {
            for (i, m) in msgs.iter().enumerate() {
                wflow.pace(i);
                tx.send(*m);
            }
            drop(tx);
        },
    )
}

/// tokio's receive used synchronously, given the same spin-then-park
/// schedule that `expiremap`'s `recv` uses internally (and crossbeam's `recv`
/// has its own): `try_recv` with 6 rounds of doubling spins and 4 yields,
/// then `blocking_recv`. Without it every empty poll parks the thread and
/// tokio measured about 10x slower here.
fn tokio_recv<T: Clone>(
    rx: &mut tokio::sync::broadcast::Receiver<T>,
) -> Result<T, tokio::sync::broadcast::error::RecvError> {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    for step in 0..10u32 {
        match rx.try_recv() {
            Ok(v) => return Ok(v),
            Err(TryRecvError::Lagged(n)) => return Err(RecvError::Lagged(n)),
            Err(TryRecvError::Closed) => return Err(RecvError::Closed),
            Err(TryRecvError::Empty) if step < 6 => {
                for _ in 0..1u32 << step {
                    std::hint::spin_loop();
                }
            }
            Err(TryRecvError::Empty) => thread::yield_now(),
        }
    }
    rx.blocking_recv()
}

fn tokio_bcast<const N: usize>(msgs: &Arc<Vec<[u8; N]>>, readers: usize) -> Duration {
    use tokio::sync::broadcast::{self, error::RecvError};
    let (tx, _) = broadcast::channel::<[u8; N]>(CAPACITY);
    let rxs: Vec<_> = (0..readers).map(|_| tx.subscribe()).collect();
    let mut rxs = rxs.into_iter();
    let case = format!("tokio/{readers}r/{N}B");
    let msgs = Arc::clone(msgs);
    let flow = Flow::new(readers);
    let wflow = Arc::clone(&flow);
    run_once(
        &case,
        readers,
        |i| {
            let mut rx = rxs.next().unwrap();
            let flow = Arc::clone(&flow);
            Box::new(move || {
                let (mut got, mut seen) = (0, 0);
                loop {
                    match tokio_recv(&mut rx) {
                        Ok(m) => {
                            black_box(m);
                            got += 1;
                            seen += 1;
                        }
                        Err(RecvError::Lagged(n)) => seen += n,
                        Err(RecvError::Closed) => return got,
                    }
                    flow.done(i, seen);
                }
            })
        },
        move || {
            for (i, m) in msgs.iter().enumerate() {
                wflow.pace(i);
                let _ = tx.send(*m);
            }
            drop(tx);
        },
    )
}

fn crossbeam_per_reader<const N: usize>(msgs: &Arc<Vec<[u8; N]>>, readers: usize) -> Duration {
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..readers)
        .map(|_| crossbeam_channel::bounded::<[u8; N]>(CAPACITY))
        .unzip();
    let mut rxs = rxs.into_iter();
    let case = format!("crossbeam/{readers}r/{N}B");
    let msgs = Arc::clone(msgs);
    let flow = Flow::new(readers);
    let wflow = Arc::clone(&flow);
    run_once(
        &case,
        readers,
        |i| {
            let rx = rxs.next().unwrap();
            let flow = Arc::clone(&flow);
            Box::new(move || {
                let mut got = 0;
                while let Ok(m) = rx.recv() {
                    black_box(m);
                    got += 1;
                    flow.done(i, got);
                }
                got
            })
        },
        move || {
            for (i, m) in msgs.iter().enumerate() {
                wflow.pace(i);
                for tx in &txs {
                    tx.send(*m).unwrap();
                }
            }
            drop(txs);
        },
    )
}

fn fanout<const N: usize>(c: &mut Criterion) {
    let msgs = inputs::<N>();
    let mut group = c.benchmark_group(format!("fanout_{N}B"));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(MESSAGES as u64));
    for readers in READERS {
        group.bench_with_input(BenchmarkId::new("expiremap", readers), &readers, |b, &r| {
            b.iter_custom(|iters| (0..iters).map(|_| ours(&msgs, r, Mode::Recv)).sum())
        });
        group.bench_with_input(
            BenchmarkId::new("expiremap-batch", readers),
            &readers,
            |b, &r| b.iter_custom(|iters| (0..iters).map(|_| ours(&msgs, r, Mode::Batch)).sum()),
        );
        group.bench_with_input(BenchmarkId::new("tokio", readers), &readers, |b, &r| {
            b.iter_custom(|iters| (0..iters).map(|_| tokio_bcast(&msgs, r)).sum())
        });
        group.bench_with_input(BenchmarkId::new("crossbeam", readers), &readers, |b, &r| {
            b.iter_custom(|iters| (0..iters).map(|_| crossbeam_per_reader(&msgs, r)).sum())
        });
    }
    group.finish();
}

fn delivery_report(_: &mut Criterion) {
    eprintln!("\ndelivered / expected messages over the whole run (lossy rings skip lagged ones):");
    for (case, delivered, expected) in DELIVERY.lock().unwrap().iter() {
        eprintln!(
            "  {case:<24} {:>6.2}%",
            100.0 * *delivered as f64 / *expected as f64
        );
    }
}

criterion_group!(benches, fanout::<16>, fanout::<128>, delivery_report);
criterion_main!(benches);
