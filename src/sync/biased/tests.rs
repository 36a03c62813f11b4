//! The biased lock on real threads (Miri runs these too; loom models of it
//! run through the map in `loom-tests`).

use super::*;
use std::sync::Arc;
use std::sync::atomic::AtomicBool as StdBool;

/// Reads until the lock is biased (each unbiased read counts towards it).
fn bias(lock: &RwLock<u64>) {
    for _ in 0..=REBIAS_PER_LINE * LINES + 1 {
        drop(lock.read());
    }
    assert!(
        lock.bias.load(Ordering::Relaxed),
        "no bias after the streak"
    );
}

#[test]
fn unbiased_reads_restore_the_bias_and_a_write_revokes_it() {
    let lock = RwLock::new(1u64);
    assert!(!lock.bias.load(Ordering::Relaxed));
    bias(&lock);
    {
        let g = lock.read();
        assert!(matches!(g.held, Held::Biased(_)), "a read of a biased lock");
        assert_eq!(*g, 1);
    }
    *lock.write() += 1;
    assert!(!lock.bias.load(Ordering::Relaxed), "the write revoked it");
    let g = lock.read();
    assert!(matches!(g.held, Held::Shared));
    assert_eq!(*g, 2);
    drop(g);
    // `read_unbiased` never announces itself, nor counts.
    let streak = lock.streak.load(Ordering::Relaxed);
    assert!(matches!(lock.read_unbiased().held, Held::Shared));
    assert_eq!(lock.streak.load(Ordering::Relaxed), streak);
}

#[test]
fn a_biased_read_holds_its_slot_until_dropped() {
    let lock = RwLock::new(0u64);
    bias(&lock);
    let g = lock.read();
    let Held::Biased(slot) = g.held else {
        panic!("not biased")
    };
    assert_eq!(slot.load(Ordering::Relaxed), lock.id());
    drop(g);
    assert_eq!(lock.slot(my_line()).load(Ordering::Relaxed), 0);
}

/// Two locks whose ids pick the same slot: the nested read of the second
/// finds the slot taken and takes the raw lock; both release cleanly and
/// a writer on another thread gets each afterwards.
#[test]
fn a_nested_read_of_a_lock_on_a_taken_slot_reads_unbiased() {
    #[repr(align(128))]
    struct Padded(RwLock<u64>);
    let locks: Arc<Vec<Padded>> =
        Arc::new((0..SLOTS + 1).map(|_| Padded(RwLock::new(7))).collect());
    let (a, b) = (&locks[0].0, &locks[SLOTS].0);
    assert_eq!((a.id() >> 7) % SLOTS, (b.id() >> 7) % SLOTS);
    bias(a);
    bias(b);
    {
        let ga = a.read();
        let gb = b.read();
        assert!(matches!(ga.held, Held::Biased(_)));
        assert!(matches!(gb.held, Held::Shared), "the slot is a's");
        assert_eq!(*ga + *gb, 14);
    }
    let l = Arc::clone(&locks);
    std::thread::spawn(move || {
        *l[0].0.write() = 1;
        *l[SLOTS].0.write() = 2;
    })
    .join()
    .unwrap();
    assert_eq!((*a.read(), *b.read()), (1, 2));
}

/// A writer on another thread does not get the lock while a biased reader
/// holds it: the reader sets a flag just before it lets go, and the writer
/// finds it set. (Sleeps give the writer time to try; nothing asserts on
/// how long anything took.)
#[test]
fn a_writer_waits_for_a_biased_reader() {
    let lock = Arc::new(RwLock::new(0u64));
    bias(&lock);
    let released = Arc::new(StdBool::new(false));
    let g = lock.read();
    assert!(matches!(g.held, Held::Biased(_)));
    let writer = {
        let (lock, released) = (Arc::clone(&lock), Arc::clone(&released));
        std::thread::spawn(move || {
            let mut w = lock.write();
            assert!(released.load(Ordering::SeqCst), "wrote under a reader");
            *w = 1;
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(if cfg!(miri) {
        1
    } else {
        20
    }));
    released.store(true, Ordering::SeqCst);
    drop(g);
    writer.join().unwrap();
    assert_eq!(*lock.read(), 1);
}

/// Readers check a pair that the writing thread keeps equal; after each
/// write that thread reads often enough to restore the bias, so the readers
/// race biased and unbiased reads, and revocations.
#[test]
fn readers_never_see_a_write_in_progress() {
    let lock = Arc::new(RwLock::new((0u64, 0u64)));
    let (rounds, reads) = if cfg!(miri) { (20, 40) } else { (2_000, 200) };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let lock = Arc::clone(&lock);
            std::thread::spawn(move || {
                for _ in 0..rounds * reads / 10 {
                    let g = lock.read();
                    assert_eq!(g.0, g.1, "a torn pair");
                }
            })
        })
        .collect();
    for i in 0..rounds {
        let mut w = lock.write();
        w.0 = i;
        std::hint::black_box(&mut *w);
        w.1 = i;
        drop(w);
        for _ in 0..reads {
            let g = lock.read();
            assert_eq!(g.0, g.1);
        }
    }
    for r in readers {
        r.join().unwrap();
    }
    let g = lock.read();
    assert_eq!(*g, (rounds - 1, rounds - 1));
}
