//! Handles borrowed from other CUDA libraries (cudarc, PyTorch, CuPy, cuda.core: their streams and events are raw
//! `CUstream`s and `CUevent`s underneath), the way rustix's `BorrowedFd` borrows a file descriptor.

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;

/// A gpu-ipc owner type ([`Stream`](super::Stream), [`Event`](super::Event)) around a raw handle that another
/// library owns: it derefs to the owner type, so it goes wherever gpu-ipc takes one (`Some(&*borrowed)` for the
/// frame API's `Option<&Stream>`), and dropping it leaves the handle alone. The lifetime `'a` stands for the
/// owner's: the borrow cannot outlive what its constructor's caller vouched for.
pub struct Borrowed<'a, T> {
    inner: ManuallyDrop<T>,
    _owner: PhantomData<&'a ()>,
}

impl<T> Borrowed<'_, T> {
    /// Wraps a value whose `Drop` must never run (its handle belongs to someone else).
    pub(super) fn new(inner: T) -> Self {
        Self { inner: ManuallyDrop::new(inner), _owner: PhantomData }
    }
}

impl<T> Deref for Borrowed<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Borrowed<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Borrowed").field(&*self.inner).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static DROPS: AtomicUsize = AtomicUsize::new(0);

    struct Owner(u32);
    impl Drop for Owner {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_borrow_derefs_to_the_owner_type_and_never_runs_its_drop() {
        {
            let borrowed = Borrowed::new(Owner(7));
            assert_eq!(borrowed.0, 7);
        }
        assert_eq!(DROPS.load(Ordering::SeqCst), 0, "the handle is someone else's to destroy");
        drop(Owner(8));
        assert_eq!(DROPS.load(Ordering::SeqCst), 1);
    }
}
