//! Scheduler experiments. The first piece is the proof: a study that forgot to start its
//! scheduler once reported 21 "different" schedulers that were all the default, so every
//! measurement window is bracketed by reads of the kernel's own sched_ext state.

pub mod sched_ext;
