//! [`Group`]: one rank's membership of a group and its in-place collectives (README, "Groups").

use std::cell::RefCell;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

use devcoord_sys as sys;

use crate::client::{Client, Element, ReduceOp};
use crate::device::DeviceRef;
use crate::error::{Code, Error, Result};

/// Join and call deadlines; `Default` is the coordinator's join limit and 30 s per call.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupOptions {
    /// How long the join waits for every rank (0: the coordinator's limit).
    pub timeout_ms: u32,
    /// How long each call waits for every rank (0: 30000).
    pub call_timeout_ms: u32,
}

/// This rank's membership of a group, from [`Group::join`] until drop (which leaves it).
/// Every rank (a thread or a process) joins with the same devices and calls the same
/// collectives in the same order; the k-th call of each rank is matched with the others'.
/// `Send`: a rank may move to another thread; it borrows the [`Client`] it joined with.
pub struct Group<'c> {
    raw: NonNull<sys::dc_group>,
    _client: PhantomData<&'c Client>,
}

// SAFETY: a dc_group serializes its calls with its own mutex and uses the thread-safe
// dc_client; nothing in it is tied to the thread that joined.
unsafe impl Send for Group<'_> {}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        let mut st = crate::client::status();
        // SAFETY: joined by dc_group_join, freed once (dc_group_leave frees it even on error).
        unsafe { sys::dc_group_leave(self.raw.as_ptr(), &mut st) };
    }
}

/// Ok when `big` is the group's size times `small` (an all-gather's recv, a reduce-scatter's
/// send), else the INVALID_ARGUMENT the blocking and async calls give alike.
fn sizes(group: NonNull<sys::dc_group>, big: usize, small: usize, what: &str) -> Result<()> {
    // SAFETY: the group is joined while a call on it is made.
    let size = unsafe { sys::dc_group_size(group.as_ptr()) } as usize;
    match small.checked_mul(size) {
        Some(want) if want == big => Ok(()),
        want => Err(Error::new(
            Code::InvalidArgument,
            format!(
                "{} has {} elements, expected {} (group size {} x {})",
                what,
                big,
                want.map_or("more than fit in memory".to_string(), |w| w.to_string()),
                size,
                small
            ),
        )),
    }
}

fn check(code: i32, st: &sys::dc_status) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::from_status(code, st))
    }
}

impl<'c> Group<'c> {
    /// Joins the group of `devices` (any order) as `me` (one of them), waiting for every rank.
    pub fn join(client: &'c Client, devices: &[DeviceRef], me: &DeviceRef) -> Result<Group<'c>> {
        Group::join_with(client, devices, me, &GroupOptions::default())
    }

    /// [`Group::join`] with deadlines.
    pub fn join_with(client: &'c Client, devices: &[DeviceRef], me: &DeviceRef, opts: &GroupOptions) -> Result<Group<'c>> {
        let list = devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
        let list = crate::client::cstring(&list)?;
        let me = crate::client::cstring(&me.to_string())?;
        let o = sys::dc_group_options { timeout_ms: opts.timeout_ms, call_timeout_ms: opts.call_timeout_ms };
        let mut out = ptr::null_mut();
        let mut st = crate::client::status();
        // SAFETY: every pointer lives across the call.
        check(unsafe { sys::dc_group_join(client.raw_ptr(), list.as_ptr(), me.as_ptr(), &o, &mut out, &mut st) }, &st)?;
        NonNull::new(out)
            .map(|raw| Group { raw, _client: PhantomData })
            .ok_or_else(|| Error::new(Code::Internal, "dc_group_join gave no group"))
    }

    /// This rank (its position in the sorted device list).
    pub fn rank(&self) -> u32 {
        // SAFETY: valid until drop.
        unsafe { sys::dc_group_rank(self.raw.as_ptr()) }
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        // SAFETY: valid until drop.
        unsafe { sys::dc_group_size(self.raw.as_ptr()) }
    }

    /// The group id: 16 hex digits, the same for any order of the same devices.
    pub fn id(&self) -> String {
        // SAFETY: a NUL-terminated string owned by the group.
        unsafe { CStr::from_ptr(sys::dc_group_id(self.raw.as_ptr())) }.to_string_lossy().into_owned()
    }

    /// The generation: each completed join of the group is a new one.
    pub fn generation(&self) -> u64 {
        // SAFETY: valid until drop.
        unsafe { sys::dc_group_generation(self.raw.as_ptr()) }
    }

    /// Cluster names of the ranks, in rank order.
    pub fn devices(&self) -> Vec<String> {
        (0..self.size())
            .map(|r| {
                // SAFETY: r < size: a string owned by the group.
                let p = unsafe { sys::dc_group_device(self.raw.as_ptr(), r) };
                crate::client::cstr_ptr(p)
            })
            .collect()
    }

    fn call(&self, f: impl FnOnce(*mut sys::dc_group, *mut sys::dc_status) -> i32) -> Result<()> {
        let mut st = crate::client::status();
        let code = f(self.raw.as_ptr(), &mut st);
        check(code, &st)
    }

    /// Every rank's `buf` becomes `op` over all ranks' bufs.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let (p, n) = (buf.as_mut_ptr() as *mut c_void, buf.len());
        // SAFETY: buf is valid for n elements of T's dtype during the call.
        self.call(|g, st| unsafe { sys::dc_all_reduce(g, p, n, T::DTYPE, op as i32, st) })
    }

    /// The root's `buf` becomes `op` over all ranks' bufs; the others' stay as they were.
    pub fn reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: u32) -> Result<()> {
        let (p, n) = (buf.as_mut_ptr() as *mut c_void, buf.len());
        // SAFETY: as all_reduce.
        self.call(|g, st| unsafe { sys::dc_reduce(g, p, n, T::DTYPE, op as i32, root, st) })
    }

    /// Every rank's `buf` becomes the root's.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: u32) -> Result<()> {
        let (p, n) = (buf.as_mut_ptr() as *mut c_void, buf.len());
        // SAFETY: as all_reduce.
        self.call(|g, st| unsafe { sys::dc_broadcast(g, p, n, T::DTYPE, root, st) })
    }

    /// `recv` (size x `send.len()` elements) gets every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        sizes(self.raw, recv.len(), send.len(), "recv")?;
        let (s, r, n) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void, send.len());
        // SAFETY: send holds n and recv size * n elements (checked above).
        self.call(|g, st| unsafe { sys::dc_all_gather(g, s, r, n, T::DTYPE, st) })
    }

    /// `send` (size x `recv.len()` elements) is reduced with `op` over all ranks; `recv` gets
    /// this rank's block of the result.
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        sizes(self.raw, send.len(), recv.len(), "send")?;
        let (s, r, n) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void, recv.len());
        // SAFETY: recv holds n and send size * n elements (checked above).
        self.call(|g, st| unsafe { sys::dc_reduce_scatter(g, s, r, n, T::DTYPE, op as i32, st) })
    }

    /// Returns when every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        // SAFETY: the group is valid.
        self.call(|g, st| unsafe { sys::dc_barrier(g, st) })
    }

    /// Runs `f` with a [`Scope`] in which calls start without waiting (`*_async`). Every
    /// call started in it has ended when `scope` returns, even if `f` panics or a
    /// [`Request`] was leaked (`std::mem::forget`): the library writes into a call's
    /// buffers until the call ends, so they are borrowed for the whole scope, as
    /// `std::thread::scope` borrows what its threads use. The k-th call a rank starts or
    /// makes is matched with the others' k-th, blocking or not.
    pub fn scope<'env, F, R>(&'env self, f: F) -> R
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
    {
        let scope = Scope { group: self.raw, calls: RefCell::new(Calls::default()), _scope: PhantomData, _env: PhantomData };
        // Dropped after f, whether f returns or unwinds: ends every call still in flight.
        struct EndAll<'s, 'scope, 'env>(&'s Scope<'scope, 'env>);
        impl Drop for EndAll<'_, '_, '_> {
            fn drop(&mut self) {
                let n = self.0.calls.borrow().slots.len();
                for index in 0..n {
                    let _ = Calls::finish(&self.0.calls, index);
                }
            }
        }
        let end = EndAll(&scope);
        let out = f(end.0);
        drop(end);
        out
    }
}

/// The calls a [`Scope`] started: each slot holds the library's request while the call is
/// in flight; ended calls' slots are used again. A [`Request`] knows its call by slot, so
/// one leaked with `mem::forget` leaks nothing and its call still ends with the scope.
#[derive(Default)]
struct Calls {
    slots: Vec<Option<NonNull<sys::dc_request>>>,
    free: Vec<usize>,
}

impl Calls {
    /// Ends the call in slot `index` of `calls` if it is still in flight (dc_wait, once) and
    /// returns its result; the slot is free again.
    fn finish(calls: &RefCell<Calls>, index: usize) -> Result<()> {
        let raw = {
            let mut c = calls.borrow_mut();
            match c.slots[index].take() {
                None => return Ok(()),
                Some(raw) => {
                    c.free.push(index);
                    raw
                }
            }
        };
        let mut st = crate::client::status();
        // SAFETY: the request is valid until dc_wait, which frees it; taken from its slot once.
        let code = unsafe { sys::dc_wait(raw.as_ptr(), &mut st) };
        check(code, &st)
    }
}

/// Calls that start without waiting, from [`Group::scope`]: each `*_async` returns a
/// [`Request`]; the buffers stay borrowed until the scope ends, when every call has ended.
///
/// ```no_run
/// # fn step(g: &devcoord::Group, grads: &mut [Vec<f32>]) -> devcoord::Result<()> {
/// g.scope(|s| {
///     let reqs = grads
///         .iter_mut()
///         .map(|b| s.all_reduce_async(b, devcoord::ReduceOp::Sum))
///         .collect::<devcoord::Result<Vec<_>>>()?;
///     reqs.into_iter().try_for_each(|r| r.wait())
/// })
/// # }
/// ```
///
/// A buffer that does not outlive the scope cannot be lent to a call, even one whose
/// request is leaked:
///
/// ```compile_fail,E0597
/// # fn step(g: &devcoord::Group) {
/// g.scope(|s| {
///     let mut local = vec![1.0f32; 4];
///     std::mem::forget(s.all_reduce_async(&mut local, devcoord::ReduceOp::Sum));
/// });
/// # }
/// ```
pub struct Scope<'scope, 'env: 'scope> {
    group: NonNull<sys::dc_group>,
    calls: RefCell<Calls>,
    // Invariant in both: 'scope cannot shrink to let a shorter-lived buffer in.
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'scope, 'env> Scope<'scope, 'env> {
    fn start(&'scope self, f: impl FnOnce(*mut sys::dc_group, *mut sys::dc_status) -> *mut sys::dc_request) -> Result<Request<'scope>> {
        let mut st = crate::client::status();
        match NonNull::new(f(self.group.as_ptr(), &mut st)) {
            Some(raw) => {
                let mut calls = self.calls.borrow_mut();
                let index = match calls.free.pop() {
                    Some(i) => i,
                    None => {
                        calls.slots.push(None);
                        calls.slots.len() - 1
                    }
                };
                calls.slots[index] = Some(raw);
                Ok(Request { calls: &self.calls, index })
            }
            None => Err(Error::from_status(if st.code == 0 { 2 } else { st.code }, &st)),
        }
    }

    /// Starts [`Group::all_reduce`] without waiting; `buf` is borrowed until the scope ends.
    pub fn all_reduce_async<T: Element>(&'scope self, buf: &'scope mut [T], op: ReduceOp) -> Result<Request<'scope>> {
        let (p, n) = (buf.as_mut_ptr() as *mut c_void, buf.len());
        // SAFETY: buf stays borrowed until the scope ends, by when the call has ended.
        self.start(|g, st| unsafe { sys::dc_all_reduce_async(g, p, n, T::DTYPE, op as i32, st) })
    }

    /// [`Group::reduce`] without waiting (as [`Scope::all_reduce_async`]).
    pub fn reduce_async<T: Element>(&'scope self, buf: &'scope mut [T], op: ReduceOp, root: u32) -> Result<Request<'scope>> {
        let (p, n) = (buf.as_mut_ptr() as *mut c_void, buf.len());
        // SAFETY: as all_reduce_async.
        self.start(|g, st| unsafe { sys::dc_reduce_async(g, p, n, T::DTYPE, op as i32, root, st) })
    }

    /// [`Group::broadcast`] without waiting (as [`Scope::all_reduce_async`]).
    pub fn broadcast_async<T: Element>(&'scope self, buf: &'scope mut [T], root: u32) -> Result<Request<'scope>> {
        let (p, n) = (buf.as_mut_ptr() as *mut c_void, buf.len());
        // SAFETY: as all_reduce_async.
        self.start(|g, st| unsafe { sys::dc_broadcast_async(g, p, n, T::DTYPE, root, st) })
    }

    /// [`Group::all_gather`] without waiting (as [`Scope::all_reduce_async`]; `send` is
    /// borrowed too: the library reads it until the call ends).
    pub fn all_gather_async<T: Element>(&'scope self, send: &'scope [T], recv: &'scope mut [T]) -> Result<Request<'scope>> {
        sizes(self.group, recv.len(), send.len(), "recv")?;
        let (s, r, n) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void, send.len());
        // SAFETY: as all_gather; both stay borrowed until the scope ends.
        self.start(|g, st| unsafe { sys::dc_all_gather_async(g, s, r, n, T::DTYPE, st) })
    }

    /// [`Group::reduce_scatter`] without waiting (as [`Scope::all_gather_async`]).
    pub fn reduce_scatter_async<T: Element>(&'scope self, send: &'scope [T], recv: &'scope mut [T], op: ReduceOp) -> Result<Request<'scope>> {
        sizes(self.group, send.len(), recv.len(), "send")?;
        let (s, r, n) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void, recv.len());
        // SAFETY: as reduce_scatter; both stay borrowed until the scope ends.
        self.start(|g, st| unsafe { sys::dc_reduce_scatter_async(g, s, r, n, T::DTYPE, op as i32, st) })
    }

    /// [`Group::barrier`] without waiting.
    pub fn barrier_async(&'scope self) -> Result<Request<'scope>> {
        // SAFETY: the group outlives the scope.
        self.start(|g, st| unsafe { sys::dc_barrier_async(g, st) })
    }
}

impl Group<'_> {
    /// A zeroed buffer of `len` elements in memory from `dc_group_alloc`: when this rank's
    /// worker runs on this host it is shared memory the worker maps too, so a call on it
    /// (the whole buffer or a range of it) moves no byte between this process and the
    /// worker, on one worker or across workers ([`SharedBuf::is_shared`] says whether it
    /// is). It derefs to `[T]`, borrows the group (so the group outlives it) and is freed
    /// on drop.
    pub fn alloc<T: Element>(&self, len: usize) -> Result<SharedBuf<'_, T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::new(Code::InvalidArgument, format!("{} elements: too many", len)))?;
        let mut st = crate::client::status();
        // SAFETY: the group is valid; the block is freed by SharedBuf's drop.
        let p = unsafe { sys::dc_group_alloc(self.raw.as_ptr(), bytes.max(1), &mut st) } as *mut T;
        let ptr = NonNull::new(p).ok_or_else(|| Error::from_status(if st.code == 0 { 8 } else { st.code }, &st))?;
        // SAFETY: the block holds `bytes` bytes; zeroed, every element is a valid T (0).
        unsafe { ptr::write_bytes(ptr.as_ptr() as *mut u8, 0, bytes) };
        Ok(SharedBuf { ptr, len, group: self.raw, _group: PhantomData })
    }
}

/// A buffer from [`Group::alloc`], freed on drop.
pub struct SharedBuf<'g, T: Element> {
    ptr: NonNull<T>,
    len: usize,
    group: NonNull<sys::dc_group>,
    _group: PhantomData<&'g ()>,
}

impl<T: Element> SharedBuf<'_, T> {
    /// Whether the worker maps this memory too (calls on it then carry no bytes).
    pub fn is_shared(&self) -> bool {
        // SAFETY: the group outlives the buffer; the pointer is its block's.
        unsafe { sys::dc_group_buffer_shared(self.group.as_ptr(), self.ptr.as_ptr() as *const c_void) }
    }
}

impl<T: Element> std::ops::Deref for SharedBuf<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: len initialized elements, alive until drop; aliasing follows &self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element> std::ops::DerefMut for SharedBuf<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as deref, exclusive through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element> Drop for SharedBuf<'_, T> {
    fn drop(&mut self) {
        // SAFETY: allocated by dc_group_alloc on this group, which is still joined (borrowed).
        unsafe { sys::dc_group_free(self.group.as_ptr(), self.ptr.as_ptr() as *mut c_void) };
    }
}

/// A call in flight, from a [`Scope`]'s `*_async` method: [`Request::wait`] ends it and
/// returns its result; dropped, it waits too (a request leaked instead ends with its scope).
pub struct Request<'scope> {
    calls: &'scope RefCell<Calls>,
    index: usize,
}

impl Request<'_> {
    /// Whether the call has ended (then `wait` returns at once); its error if it failed.
    pub fn test(&self) -> Result<bool> {
        let raw = match self.calls.borrow().slots[self.index] {
            Some(r) => r,
            None => return Ok(true),
        };
        let mut done = false;
        let mut st = crate::client::status();
        // SAFETY: the request is valid until dc_wait, which only Calls::finish calls.
        let code = unsafe { sys::dc_test(raw.as_ptr(), &mut done, &mut st) };
        if done {
            check(code, &st)?;
        }
        Ok(done)
    }

    /// Waits for the call to end and returns its result.
    pub fn wait(self) -> Result<()> {
        Calls::finish(self.calls, self.index)
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        // The library writes into the borrowed buffer until the call ends.
        let _ = Calls::finish(self.calls, self.index);
    }
}
