//! A small AF_XDP socket (Documentation/networking/af_xdp.rst) over libc: one UMEM, its fill
//! and completion rings, one RX and one TX ring, bound in copy mode to one queue.
//!
//! Why not a crate: `xsk-rs` (the maintained Rust binding) builds libxdp from source through
//! `libxdp-sys` and pulls `libbpf-sys` 1.5, while the agent links `libbpf-sys` 1.7 through
//! libbpf-rs — two crates with `links = "bpf"` cannot be in one binary — and libxdp's build
//! needs m4. The libc crate carries the kernel's structs and constants (`xdp_umem_reg`,
//! `xdp_mmap_offsets`, `sockaddr_xdp`, `xdp_desc`), so what is left here is the ring protocol:
//! single producer / single consumer indices in shared memory, read with Acquire and published
//! with Release, exactly as libxdp's xsk.h does.
//!
//! The frames stay where the kernel put them: a frame to send on is TX'd from the same UMEM
//! address (no copy in user space); dropped frames and completed sends go back to the fill ring.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// Size of one UMEM frame (aligned mode: addresses of a frame share `addr & !(FRAME_SIZE-1)`).
pub const FRAME_SIZE: u32 = 2048;
/// Frames in the UMEM.
pub const NUM_FRAMES: u32 = 4096;
/// Entries of each ring (power of two).
pub const RING_SIZE: u32 = 2048;

struct Ring {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    descs: *mut u8,
    mask: u32,
    size: u32,
    map: *mut libc::c_void,
    map_len: usize,
}

impl Ring {
    /// Maps one ring of `elem`-byte entries at page offset `pgoff` with protection `prot`.
    fn map(fd: i32, off: &libc::xdp_ring_offset, elem: usize, pgoff: u64, prot: libc::c_int) -> io::Result<Self> {
        let map_len = off.desc as usize + RING_SIZE as usize * elem;
        // SAFETY: mapping a region the kernel created for this socket (setsockopt *_RING).
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                prot,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = map.cast::<u8>();
        // SAFETY: the offsets come from XDP_MMAP_OFFSETS and lie inside the mapping.
        unsafe {
            Ok(Self {
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                descs: base.add(off.desc as usize),
                mask: RING_SIZE - 1,
                size: RING_SIZE,
                map,
                map_len,
            })
        }
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping, 4-byte aligned (kernel layout).
        unsafe { &*self.producer }
    }

    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    /// Producer side: free slots.
    fn free(&self) -> u32 {
        let prod = self.prod().load(Ordering::Relaxed);
        let cons = self.cons().load(Ordering::Acquire);
        self.size - prod.wrapping_sub(cons)
    }

    /// Consumer side: entries ready.
    fn ready(&self) -> u32 {
        let prod = self.prod().load(Ordering::Acquire);
        let cons = self.cons().load(Ordering::Relaxed);
        prod.wrapping_sub(cons)
    }

    fn addr_slot(&self, idx: u32) -> *mut u64 {
        // SAFETY: masked index inside the ring of u64 entries.
        unsafe { self.descs.cast::<u64>().add((idx & self.mask) as usize) }
    }

    fn desc_slot(&self, idx: u32) -> *mut libc::xdp_desc {
        // SAFETY: masked index inside the ring of xdp_desc entries.
        unsafe { self.descs.cast::<libc::xdp_desc>().add((idx & self.mask) as usize) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map` mapped.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// One received frame: UMEM address (with the kernel's offset) and length.
#[derive(Debug, Clone, Copy)]
pub struct Frame {
    pub addr: u64,
    pub len: u32,
}

pub struct Xsk {
    fd: OwnedFd,
    umem: *mut u8,
    umem_len: usize,
    fill: Ring,
    comp: Ring,
    rx: Ring,
    tx: Ring,
    /// UMEM frames owned by user space (not in the fill ring, not in flight).
    free: Vec<u64>,
}

// SAFETY: the raw pointers point into mappings owned by this value; one thread uses it.
unsafe impl Send for Xsk {}

fn check(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

fn mmap_offsets(fd: i32) -> io::Result<libc::xdp_mmap_offsets> {
    // SAFETY: zeroed is a valid xdp_mmap_offsets; the kernel fills it.
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    let mut optlen = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
    // SAFETY: off/optlen valid for writing.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, (&mut off as *mut libc::xdp_mmap_offsets).cast(), &mut optlen)
    };
    check(rc, "XDP_MMAP_OFFSETS")?;
    Ok(off)
}

fn setopt<T>(fd: i32, opt: libc::c_int, v: &T, what: &str) -> io::Result<()> {
    // SAFETY: v is a valid T for the duration of the call.
    let rc = unsafe {
        libc::setsockopt(fd, libc::SOL_XDP, opt, (v as *const T).cast(), std::mem::size_of::<T>() as u32)
    };
    check(rc, what)
}

impl Xsk {
    /// Creates the socket and UMEM and binds them (copy mode) to `queue` of `ifindex`.
    pub fn bind(ifindex: u32, queue: u32) -> io::Result<Self> {
        // SAFETY: plain syscalls; every result is checked.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        check(raw, "socket(AF_XDP)")?;
        // SAFETY: raw is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem_len = (NUM_FRAMES * FRAME_SIZE) as usize;
        // SAFETY: anonymous private mapping.
        let umem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(io::Error::other(format!("mmap UMEM: {}", io::Error::last_os_error())));
        }
        let umem = umem.cast::<u8>();
        let guard = UmemGuard(umem, umem_len);
        let reg = libc::xdp_umem_reg {
            addr: umem as u64,
            len: umem_len as u64,
            chunk_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setopt(raw, libc::XDP_UMEM_REG, &reg, "XDP_UMEM_REG")?;
        for (opt, what) in [
            (libc::XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING"),
            (libc::XDP_UMEM_COMPLETION_RING, "XDP_UMEM_COMPLETION_RING"),
            (libc::XDP_RX_RING, "XDP_RX_RING"),
            (libc::XDP_TX_RING, "XDP_TX_RING"),
        ] {
            setopt(raw, opt, &RING_SIZE, what)?;
        }
        let off = mmap_offsets(raw)?;
        let (desc, rw) = (std::mem::size_of::<libc::xdp_desc>(), libc::PROT_READ | libc::PROT_WRITE);
        let fill = Ring::map(raw, &off.fr, 8, libc::XDP_UMEM_PGOFF_FILL_RING, rw)?;
        let comp = Ring::map(raw, &off.cr, 8, libc::XDP_UMEM_PGOFF_COMPLETION_RING, rw)?;
        let rx = Ring::map(raw, &off.rx, desc, libc::XDP_PGOFF_RX_RING as u64, rw)?;
        let tx = Ring::map(raw, &off.tx, desc, libc::XDP_PGOFF_TX_RING as u64, rw)?;
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_COPY,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: sa is a valid sockaddr_xdp.
        let rc = unsafe {
            libc::bind(raw, (&sa as *const libc::sockaddr_xdp).cast(), std::mem::size_of::<libc::sockaddr_xdp>() as u32)
        };
        check(rc, &format!("bind AF_XDP to ifindex {ifindex} queue {queue}"))?;
        std::mem::forget(guard);
        let mut xsk = Self {
            fd,
            umem,
            umem_len,
            fill,
            comp,
            rx,
            tx,
            free: (0..NUM_FRAMES as u64).map(|i| i * FRAME_SIZE as u64).rev().collect(),
        };
        xsk.refill();
        Ok(xsk)
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// A second descriptor of the socket, for reading its statistics from another thread.
    pub fn dup_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Gives free frames to the kernel (fill ring).
    fn refill(&mut self) {
        let n = self.fill.free().min(self.free.len() as u32);
        if n == 0 {
            return;
        }
        let prod = self.fill.prod().load(Ordering::Relaxed);
        for i in 0..n {
            let addr = self.free.pop().unwrap_or_default();
            // SAFETY: slot reserved (n ≤ free entries), single producer.
            unsafe { *self.fill.addr_slot(prod.wrapping_add(i)) = addr };
        }
        self.fill.prod().store(prod.wrapping_add(n), Ordering::Release);
    }

    /// Takes back frames whose send completed.
    fn reclaim(&mut self) {
        let n = self.comp.ready();
        let cons = self.comp.cons().load(Ordering::Relaxed);
        for i in 0..n {
            // SAFETY: entry published by the kernel (ready()).
            let addr = unsafe { *self.comp.addr_slot(cons.wrapping_add(i)) };
            self.free.push(addr & !(FRAME_SIZE as u64 - 1));
        }
        self.comp.cons().store(cons.wrapping_add(n), Ordering::Release);
    }

    /// Waits up to `timeout_ms` for frames (0 = do not block).
    pub fn wait(&self, timeout_ms: i32) -> io::Result<bool> {
        if self.rx.ready() > 0 {
            return Ok(true);
        }
        if timeout_ms == 0 {
            return Ok(false);
        }
        let mut pfd = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(self.rx.ready() > 0);
            }
            return Err(e);
        }
        Ok(self.rx.ready() > 0)
    }

    /// Receives up to `max` frames, lets `f` process each in place (it returns the length to
    /// send, or None to drop), sends the kept ones on, and returns (received, sent).
    pub fn process(
        &mut self,
        max: u32,
        mut f: impl FnMut(&mut [u8]) -> Option<u32>,
    ) -> io::Result<(u32, u32)> {
        self.reclaim();
        self.refill();
        let n = self.rx.ready().min(max).min(self.tx.free());
        if n == 0 {
            return Ok((0, 0));
        }
        let rx_cons = self.rx.cons().load(Ordering::Relaxed);
        let tx_prod = self.tx.prod().load(Ordering::Relaxed);
        let mut sent = 0u32;
        for i in 0..n {
            // SAFETY: entry published by the kernel.
            let d = unsafe { *self.rx.desc_slot(rx_cons.wrapping_add(i)) };
            let start = d.addr as usize;
            let end = start + d.len as usize;
            if end > self.umem_len || d.len > FRAME_SIZE {
                self.free.push(d.addr & !(FRAME_SIZE as u64 - 1));
                continue;
            }
            // SAFETY: [start, end) lies inside the UMEM and the kernel handed the frame over.
            let frame = unsafe { std::slice::from_raw_parts_mut(self.umem.add(start), d.len as usize) };
            match f(frame) {
                Some(len) if len > 0 && len <= d.len => {
                    // SAFETY: tx slot reserved (n ≤ tx.free()), single producer.
                    unsafe {
                        *self.tx.desc_slot(tx_prod.wrapping_add(sent)) =
                            libc::xdp_desc { addr: d.addr, len, options: 0 };
                    }
                    sent += 1;
                }
                _ => self.free.push(d.addr & !(FRAME_SIZE as u64 - 1)),
            }
        }
        self.rx.cons().store(rx_cons.wrapping_add(n), Ordering::Release);
        if sent > 0 {
            self.tx.prod().store(tx_prod.wrapping_add(sent), Ordering::Release);
            // Copy mode sends only when kicked.
            // SAFETY: kick with no payload, as libxdp's xsk_ring_prod__needs_wakeup path does.
            let rc = unsafe {
                libc::sendto(self.fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0)
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN)) {
                    return Err(io::Error::new(e.kind(), format!("AF_XDP TX kick: {e}")));
                }
            }
        }
        self.refill();
        Ok((n, sent))
    }
}

/// Frames the kernel could not hand to the socket (XDP_STATISTICS, monotonic): its RX ring
/// was full (`rx_ring_full`: the worker fell behind) or the fill ring had no free frame
/// (`rx_dropped`: frames still in the worker's hands).
pub fn rx_dropped(fd: i32) -> io::Result<u64> {
    // SAFETY: zeroed is a valid xdp_statistics; the kernel fills it.
    let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
    // SAFETY: st/len valid for writing.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_XDP, libc::XDP_STATISTICS, (&mut st as *mut libc::xdp_statistics).cast(), &mut len)
    };
    check(rc, "XDP_STATISTICS")?;
    Ok(st.rx_dropped + st.rx_ring_full)
}

/// A read-only second mapping of a socket's RX ring, for another thread than its worker: how
/// many frames wait in it (the worker owns the ring and never reads this view).
///
/// Why a second mapping rather than a share of the worker's: the ring's memory lives as long
/// as a mapping of it (the mapping holds the socket's file), so the view stays valid whatever
/// the worker does, and read-only pages make "the sampler never moves an index" the MMU's
/// business.
pub struct RxView {
    ring: Ring,
}

// SAFETY: the view only loads the ring's two indices atomically from a mapping it owns; the
// kernel (producer) and the worker (consumer) write them, never through this view.
unsafe impl Send for RxView {}
// SAFETY: as above: `waiting` takes &self and does atomic loads only.
unsafe impl Sync for RxView {}

impl RxView {
    /// Maps the RX ring of the AF_XDP socket `fd` (bound, its RX ring set up) read-only.
    pub fn map(fd: i32) -> io::Result<Self> {
        let off = mmap_offsets(fd)?;
        let desc = std::mem::size_of::<libc::xdp_desc>();
        let ring = Ring::map(fd, &off.rx, desc, libc::XDP_PGOFF_RX_RING as u64, libc::PROT_READ)
            .map_err(|e| io::Error::new(e.kind(), format!("read-only mapping of the RX ring: {e}")))?;
        Ok(Self { ring })
    }

    /// Frames the kernel has put in the ring that the worker has not taken yet.
    pub fn waiting(&self) -> u32 {
        // The consumer first: both indices only grow, so a producer read after it is at least
        // as far, and the difference is never negative (capped at the ring's size).
        let cons = self.ring.cons().load(Ordering::Acquire);
        let prod = self.ring.prod().load(Ordering::Acquire);
        waiting(prod, cons, self.ring.size)
    }
}

/// Entries between a ring's consumer and producer indices (free-running u32), at most `size`.
pub fn waiting(prod: u32, cons: u32, size: u32) -> u32 {
    prod.wrapping_sub(cons).min(size)
}

struct UmemGuard(*mut u8, usize);

impl Drop for UmemGuard {
    fn drop(&mut self) {
        // SAFETY: unmapping the UMEM mapped in bind (only on its error paths).
        unsafe { libc::munmap(self.0.cast(), self.1) };
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        // Rings unmap themselves; the socket closes with `fd`; then the UMEM.
        // SAFETY: the UMEM mapping is ours and no ring refers to it after the socket closes.
        unsafe { libc::munmap(self.umem.cast(), self.umem_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::waiting;

    #[test]
    fn waiting_frames_are_the_index_difference_across_the_wrap_capped_at_the_ring() {
        assert_eq!(waiting(10, 10, 2048), 0);
        assert_eq!(waiting(15, 10, 2048), 5);
        assert_eq!(waiting(3, u32::MAX - 1, 2048), 5, "the producer wrapped");
        assert_eq!(waiting(5000, 10, 2048), 2048, "a consumer read long before the producer");
    }
}
