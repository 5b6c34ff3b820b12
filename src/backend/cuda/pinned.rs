//! Pinned host staging for the asynchronous host-to-device copies of `Action::CopyInAsync`
//! (the step's arguments): a ring of page-locked slots, each guarded by an event recorded
//! after its copy. A slot is reused only after that event: the host never blocks unless the
//! device is a whole ring of steps behind, and the bytes a queued copy reads are never
//! overwritten before it ran (a copy from pageable memory would block the host instead).

use cudarc::driver::sys as cu;

use crate::backend::cuda::action::DevPtr;
use crate::backend::cuda::device::driver_check;
use crate::bail;
use crate::error::Result;

/// Slots in the ring: copies that may be queued at once.
const SLOTS: usize = 8;
/// Bytes per slot.
const SLOT_BYTES: usize = 256;
/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_DISABLE_TIMING: u32 = 2;

struct Slot {
    host: *mut u8,
    done: cu::CUevent,
}

/// The ring; slots are allocated on first use.
#[derive(Default)]
pub struct PinnedRing {
    slots: Vec<Slot>,
    next: usize,
}

impl PinnedRing {
    /// Queues a copy of `bytes` to `dst` on `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context, and `dst` a device range of at least
    /// `bytes.len()` bytes in it.
    pub unsafe fn copy(&mut self, dst: DevPtr, bytes: &[u8], stream: cu::CUstream) -> Result<()> {
        if bytes.len() > SLOT_BYTES {
            bail!(
                Internal,
                "an asynchronous copy of {} bytes exceeds the {SLOT_BYTES}-byte staging slot",
                bytes.len()
            );
        }
        if self.slots.len() < SLOTS {
            let mut host = std::ptr::null_mut();
            // SAFETY: plain out-parameter in the current context.
            driver_check(|| "cuMemAllocHost".into(), unsafe {
                cu::cuMemAllocHost_v2(&mut host, SLOT_BYTES)
            })?;
            let mut done = std::ptr::null_mut();
            // SAFETY: plain out-parameter in the current context.
            let created = unsafe { cu::cuEventCreate(&mut done, EVENT_DISABLE_TIMING) };
            if let Err(err) = driver_check(|| "cuEventCreate".into(), created) {
                // SAFETY: allocated just above, never used.
                unsafe { cu::cuMemFreeHost(host) };
                return Err(err);
            }
            self.slots.push(Slot {
                host: host.cast(),
                done,
            });
            self.next = self.slots.len() - 1;
        } else {
            // SAFETY: our event, recorded after this slot's previous copy.
            driver_check(|| "cuEventSynchronize(staging slot)".into(), unsafe {
                cu::cuEventSynchronize(self.slots[self.next].done)
            })?;
        }
        let slot = &self.slots[self.next];
        self.next = (self.next + 1) % SLOTS;
        // SAFETY: the slot holds SLOT_BYTES >= bytes.len() bytes and no queued copy reads it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot.host, bytes.len()) };
        // SAFETY: pinned source, a device range the translator checked, a live stream.
        driver_check(|| format!("cuMemcpyHtoDAsync({} bytes, pinned)", bytes.len()), unsafe {
            cu::cuMemcpyHtoDAsync_v2(dst, slot.host.cast(), bytes.len(), stream)
        })?;
        // SAFETY: our event on a live stream.
        driver_check(|| "cuEventRecord(staging slot)".into(), unsafe {
            cu::cuEventRecord(slot.done, stream)
        })
    }

    /// Frees every slot once its copy finished (teardown: errors are ignored).
    pub fn destroy(&mut self) {
        for slot in self.slots.drain(..) {
            // SAFETY: our event and pinned allocation, freed once.
            unsafe {
                cu::cuEventSynchronize(slot.done);
                cu::cuEventDestroy_v2(slot.done);
                cu::cuMemFreeHost(slot.host.cast());
            }
        }
    }
}
