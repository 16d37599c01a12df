//! The AF_XDP runtime against the real kernel, in a private network namespace: instances
//! pinned and unpinned, a failed scale-out undone, and a worker's load in its counters (the
//! busy share follows the traffic; a CPU hog on its core shows as frames lost to a full ring,
//! and, before that, as a stall with frames waiting).
//! Needs root and two online CPUs; prints "skipped: …" otherwise. The tests hog a core and
//! time what follows, so they run one at a time.
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{AdvChain, AdvFn, Advanced, PARK_MS, WorkerReading};
use crate::datapath::Datapath;
use crate::netif::ifindex;
use crate::nodes::busy_ratio;
use cgloop_proto::v1::chain_function::Function;
use cgloop_proto::v1::{Dpi, dpi};

const PORT: &str = "cgltest0";
const SLOT: u32 = 3;

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Root and two online CPUs (this thread's and the worker's), or None after saying why not.
fn root_and_two_cpus() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return None;
    }
    let cpus = crate::bounds::online_cpus();
    if cpus.len() < 2 {
        eprintln!("skipped: needs two online CPUs");
        return None;
    }
    Some((cpus[0], cpus[cpus.len() - 1]))
}

/// Runs `f` on a thread of its own in a private network namespace.
fn in_namespace(f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        // SAFETY: plain syscall; affects this thread (and what it spawns) only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare(CLONE_NEWNET)");
        f();
    })
    .join()
    .expect("the namespace thread");
}

fn dpi() -> Function {
    Function::Dpi(Dpi {
        pattern: Some(dpi::Pattern::Text("GAME".into())),
        depth: None,
        on_match: Some(dpi::OnMatch::MarkDscp(46)),
    })
}

/// A SCHED_FIFO thread at `priority` spinning on `core` for `for_`; returns once it spins.
fn hog(core: u32, priority: i32, for_: Duration) -> std::thread::JoinHandle<()> {
    let spinning = Arc::new(AtomicBool::new(false));
    let flag = spinning.clone();
    let hog = std::thread::spawn(move || {
        pin_this_thread(core);
        let param = libc::sched_param { sched_priority: priority };
        // SAFETY: plain syscall on this thread.
        assert_eq!(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) }, 0);
        flag.store(true, Ordering::Release);
        let end = Instant::now() + for_;
        while Instant::now() < end {
            std::hint::spin_loop();
        }
    });
    let deadline = Instant::now() + Duration::from_secs(2);
    while !spinning.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline, "the hog did not start");
        std::thread::sleep(Duration::from_millis(1));
    }
    hog
}

fn allowed_cpus(tid: libc::pid_t) -> String {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")).unwrap();
    line.split_whitespace().nth(1).unwrap_or_default().to_string()
}

fn pin_this_thread(core: u32) {
    // SAFETY: an empty set with one CPU below CPU_SETSIZE, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core as usize, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
    }
}

/// A raw socket sending on the port (its peer's XDP program hands the frames to instance 0).
struct Sender(i32);

impl Sender {
    fn open(ifindex: u32) -> Self {
        // SAFETY: plain syscalls, results checked.
        unsafe {
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
            assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
            let mut sa: libc::sockaddr_ll = std::mem::zeroed();
            sa.sll_family = libc::AF_PACKET as u16;
            sa.sll_ifindex = ifindex as i32;
            let len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            assert_eq!(libc::bind(fd, (&sa as *const libc::sockaddr_ll).cast(), len), 0);
            Self(fd)
        }
    }

    /// A tagged IPv4/UDP frame for slot SLOT, sequence `i` in its payload.
    fn send(&self, i: u32) {
        let mut f = vec![0x02, 0, 0, 0, 0, 1, 0xc6, 0x1a, 0, SLOT as u8, 0, 1, 0x08, 0x00];
        let payload = [b"GAME".as_slice(), &i.to_be_bytes(), &[0u8; 40]].concat();
        let total = (20 + 8 + payload.len()) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 9, 0, 1, 10, 9, 0, 2]);
        f.extend_from_slice(&[0x9c, 0x40, 0x23, 0x28]);
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&payload);
        // SAFETY: a valid buffer on a bound socket.
        unsafe { libc::send(self.0, f.as_ptr().cast(), f.len(), 0) };
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        // SAFETY: our fd.
        unsafe { libc::close(self.0) };
    }
}

fn reading(adv: &Advanced) -> WorkerReading {
    adv.readings(&[SLOT], 1).remove(0)
}

fn packets(r: &WorkerReading) -> u64 {
    r.functions.iter().map(|(_, p, _)| p).sum()
}

/// Waits until the worker has seen `n` packets (or 5 s).
fn settle(adv: &Advanced, n: u64) -> WorkerReading {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = reading(adv);
        if packets(&r) >= n || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn instances_are_pinned_a_failed_scale_out_is_undone_and_a_hog_shows_in_the_counters() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some((here, core)) = root_and_two_cpus() else { return };
    in_namespace(move || run_in_namespace(here, core));
}

fn run_in_namespace(here: u32, core: u32) {
    let dp = Datapath::load().unwrap();
    let mut adv = Advanced::start(&dp, PORT, 0, 0).unwrap();
    let all = allowed_cpus(adv.instances[0].tid);

    // Pinned to its core, then unpinned (core 0 of the request: every online CPU).
    adv.scale(&dp, &[core]).unwrap();
    assert_eq!(allowed_cpus(adv.instances[0].tid), core.to_string());
    let undo = adv.scale(&dp, &[0]).unwrap();
    assert_eq!(allowed_cpus(adv.instances[0].tid), all);
    adv.undo(&dp, undo);
    assert_eq!(allowed_cpus(adv.instances[0].tid), core.to_string(), "undo re-pins");

    // A second instance cannot get its port (its peer's name is taken): nothing changes.
    let blocker = format!("{PORT}-1p");
    let ip = |args: &[&str]| assert!(Command::new("ip").args(args).status().unwrap().success(), "ip {args:?}");
    ip(&["link", "add", &blocker, "type", "veth", "peer", "name", "cglblock"]);
    let err = adv.scale(&dp, &[0, core]).unwrap_err();
    assert!(format!("{err:#}").contains(&format!("{PORT}-1")), "{err:#}");
    assert_eq!(adv.instances(), 1);
    assert_eq!(allowed_cpus(adv.instances[0].tid), core.to_string(), "instance 0 as it was");
    assert!(ifindex(&format!("{PORT}-1")).is_err(), "the half-made port is gone");
    ip(&["link", "del", &blocker]);
    let undo = adv.scale(&dp, &[core, core]).unwrap();
    assert_eq!(adv.instances(), 2);
    assert_eq!(allowed_cpus(adv.instances[1].tid), core.to_string());
    adv.undo(&dp, undo);
    assert_eq!(adv.instances(), 1);
    assert!(ifindex(&format!("{PORT}-1")).is_err(), "undo removed the second instance's port");

    // The load in the counters.
    adv.install(SLOT, AdvChain { fns: vec![AdvFn::new(crate::payload::build(&dpi(), 0).unwrap())] });
    pin_this_thread(here);
    let tx = Sender::open(adv.port());
    let idle0 = reading(&adv);
    std::thread::sleep(Duration::from_millis(200));
    let idle1 = reading(&adv);
    for i in 0..3000u32 {
        tx.send(i);
        if i % 100 == 99 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let loaded = settle(&adv, 3000);
    assert_eq!(packets(&loaded), 3000, "every paced frame reached the worker");
    assert_eq!(loaded.rx_dropped, 0, "no ring losses at a pace the worker keeps up with");
    let idle = busy_ratio(Some((idle0.busy_ns, idle0.at_ns)), idle1.busy_ns, idle1.at_ns).unwrap();
    let busy = busy_ratio(Some((idle1.busy_ns, idle1.at_ns)), loaded.busy_ns, loaded.at_ns).unwrap();
    assert!(busy > idle, "busy share under load {busy} not above idle {idle}");

    // A real-time hog on the worker's core for 0.6 s: the frames sent meanwhile overflow its
    // ring and are counted as lost.
    let hog = hog(core, 50, Duration::from_millis(600));
    for i in 0..12_000u32 {
        tx.send(i);
    }
    hog.join().unwrap();
    let after = settle(&adv, 3000 + 12_000);
    assert!(
        after.rx_dropped > 0,
        "no ring losses while a hog held the worker's core ({} of 12000 frames processed)",
        packets(&after) - 3000
    );
    eprintln!(
        "busy share idle {idle:.4}, loaded {busy:.4}; under the hog {} of 12000 frames lost to a full ring",
        after.rx_dropped
    );
}

#[test]
fn a_starved_worker_reads_stalled_with_frames_waiting_long_before_its_ring_overflows() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some((here, core)) = root_and_two_cpus() else { return };
    in_namespace(move || starve(here, core));
}

/// Sends one frame a millisecond (a gaming stream's pace) for `for_`, reading the worker every
/// 10 ms; returns the frames sent and the readings.
fn paced(adv: &Advanced, tx: &Sender, first: u32, for_: Duration) -> (u32, Vec<WorkerReading>) {
    let (start, mut sent, mut readings) = (Instant::now(), 0u32, Vec::new());
    while start.elapsed() < for_ {
        tx.send(first + sent);
        sent += 1;
        if sent % 10 == 0 {
            readings.push(reading(adv));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (sent, readings)
}

fn starve(here: u32, core: u32) {
    let dp = Datapath::load().unwrap();
    // SCHED_FIFO 10 as the agent's default advanced_rt_priority; the lab's fault is a hog above.
    let mut adv = Advanced::start(&dp, PORT, 0, 10).unwrap();
    adv.scale(&dp, &[core]).unwrap();
    adv.install(SLOT, AdvChain { fns: vec![AdvFn::new(crate::payload::build(&dpi(), 0).unwrap())] });
    pin_this_thread(here);
    let tx = Sender::open(adv.port());

    // Keeping up at a stream's pace: never stalled beyond its sleep between looks at the ring.
    let (kept, readings) = paced(&adv, &tx, 0, Duration::from_millis(300));
    let worst = readings.iter().map(|r| r.stalled_ns).max().unwrap_or_default();
    assert!(worst < 5 * PARK_MS as u64 * 1_000_000, "a worker that keeps up read stalled {worst} ns");
    settle(&adv, kept as u64);
    std::thread::sleep(Duration::from_millis(3 * PARK_MS as u64));
    let idle = reading(&adv);
    assert_eq!((idle.rx_waiting, idle.stalled_ns), (0, 0), "an idle worker with an empty ring");

    // A higher SCHED_FIFO hog takes its core for 0.3 s while the stream goes on.
    let hog = hog(core, 50, Duration::from_millis(300));
    let (starved, during) = paced(&adv, &tx, kept, Duration::from_millis(150));
    hog.join().unwrap();
    let last = during.last().expect("readings while starved");
    assert!(last.rx_waiting > 0, "no frames waiting while the worker was starved: {last:?}");
    assert!(last.stalled_ns >= 100_000_000, "150 ms starved read stalled {} ns: {last:?}", last.stalled_ns);
    assert_eq!(last.rx_dropped, 0, "the ring has not overflowed: rx_dropped says nothing yet");
    assert_eq!(packets(last), kept as u64, "the starved worker took nothing");

    // The core back: the worker drains its ring and is no longer stalled.
    let after = settle(&adv, (kept + starved) as u64);
    assert_eq!(packets(&after), (kept + starved) as u64, "every frame processed after the hog");
    std::thread::sleep(Duration::from_millis(3 * PARK_MS as u64));
    let after = reading(&adv);
    assert_eq!((after.rx_waiting, after.stalled_ns, after.rx_dropped), (0, 0, 0), "after the hog");
    eprintln!(
        "keeping up: stalled at most {worst} ns; starved 150 ms: {} frames waiting, stalled {} ns, \
         none lost",
        last.rx_waiting, last.stalled_ns
    );
}
