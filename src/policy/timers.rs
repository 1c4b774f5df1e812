//! The timer table: one row per timed policy component, so that a driver sleeps on one
//! deadline only — [`TimerTable::next`] — in the style of quinn-proto's
//! `poll_timeout()`.
//!
//! Every component that owns deadlines reports its earliest one after each event; the
//! table keeps the rows and answers the earliest with the row that owns it, so a driver
//! knows what fires (the simulator measures VM utilisation before an epoch closes).

use super::Time;

/// The timed components of the policy core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Timer {
    /// The open epoch ends (LIBRA §III-A, traffic monitor).
    EpochEnd,
    /// A booting VM reaches its boot deadline.
    VmBoot,
    /// An idle function instance's keep-alive runs out (FaaSim §3).
    KeepAlive,
    /// A queued call reaches its longest wait (call scheduling).
    QueueWait,
    /// The asynchronous-call scheduler's next release or mode switch (ProFaaStinate).
    DelayQueue,
    /// The adaptive r_max controller's period ends (LIBRA §III-B; `policy::rmax`).
    RMax,
}

impl Timer {
    /// Every row, in table order (ties between rows resolve in this order).
    pub const ALL: [Timer; 6] = [
        Timer::EpochEnd,
        Timer::VmBoot,
        Timer::KeepAlive,
        Timer::QueueWait,
        Timer::DelayQueue,
        Timer::RMax,
    ];

    /// Label for logs: `epoch_end`, `vm_boot`, `keep_alive`, `queue_wait`, `delay_queue`,
    /// `r_max`.
    pub fn as_str(self) -> &'static str {
        match self {
            Timer::EpochEnd => "epoch_end",
            Timer::VmBoot => "vm_boot",
            Timer::KeepAlive => "keep_alive",
            Timer::QueueWait => "queue_wait",
            Timer::DelayQueue => "delay_queue",
            Timer::RMax => "r_max",
        }
    }
}

/// The earliest deadline of each timed component. See the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerTable {
    rows: [Option<Time>; Timer::ALL.len()],
    /// The earliest row, kept up to date by [`Self::set`] (drivers ask after every
    /// event; rows rarely change).
    next: Option<(Timer, Time)>,
}

impl TimerTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set (or clear, with `None`) the deadline of `timer`.
    #[inline]
    pub fn set(&mut self, timer: Timer, at: Option<Time>) {
        if self.rows[timer as usize] == at {
            return;
        }
        self.rows[timer as usize] = at;
        let mut best: Option<(Timer, Time)> = None;
        for t in Timer::ALL {
            if let Some(at) = self.rows[t as usize]
                && best.is_none_or(|(_, b)| at < b)
            {
                best = Some((t, at));
            }
        }
        self.next = best;
    }

    /// Set every row at once, in [`Timer::ALL`] order: what [`Self::set`] of each row
    /// gives, in one comparison when nothing changed (the policy core refreshes the whole
    /// table after every event).
    #[inline]
    pub fn set_all(&mut self, rows: [Option<Time>; Timer::ALL.len()]) {
        if self.rows == rows {
            return;
        }
        self.rows = rows;
        let mut best: Option<(Timer, Time)> = None;
        for t in Timer::ALL {
            if let Some(at) = self.rows[t as usize]
                && best.is_none_or(|(_, b)| at < b)
            {
                best = Some((t, at));
            }
        }
        self.next = best;
    }

    /// The deadline of `timer`.
    #[must_use]
    pub fn get(&self, timer: Timer) -> Option<Time> {
        self.rows[timer as usize]
    }

    /// The earliest deadline and its owner; ties go to the row listed first in
    /// [`Timer::ALL`]. `None` when no component has a deadline. O(1).
    #[must_use]
    #[inline]
    pub fn next(&self) -> Option<(Timer, Time)> {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_earliest_row_wins_and_ties_go_to_the_first_row() {
        let mut t = TimerTable::new();
        assert_eq!(t.next(), None);
        t.set(Timer::KeepAlive, Some(Duration::from_secs(7)));
        t.set(Timer::EpochEnd, Some(Duration::from_secs(9)));
        assert_eq!(t.next(), Some((Timer::KeepAlive, Duration::from_secs(7))));
        t.set(Timer::VmBoot, Some(Duration::from_secs(7)));
        assert_eq!(t.next(), Some((Timer::VmBoot, Duration::from_secs(7))));
        t.set(Timer::VmBoot, None);
        t.set(Timer::KeepAlive, None);
        assert_eq!(t.next(), Some((Timer::EpochEnd, Duration::from_secs(9))));
        assert_eq!(t.get(Timer::KeepAlive), None);
    }

    #[test]
    fn setting_all_rows_equals_setting_each() {
        let ms = Duration::from_millis;
        let states: [[Option<Time>; 6]; 4] = [
            [Some(ms(9)), None, Some(ms(7)), None, None, Some(ms(7))],
            [Some(ms(9)), Some(ms(3)), None, Some(ms(3)), None, None],
            [None; 6],
            [Some(ms(4)), None, None, None, Some(ms(2)), Some(ms(5))],
        ];
        let (mut each, mut all) = (TimerTable::new(), TimerTable::new());
        for rows in states.iter().chain(states.iter().rev()) {
            for t in Timer::ALL {
                each.set(t, rows[t as usize]);
            }
            all.set_all(*rows);
            assert_eq!(all, each);
        }
    }

    #[test]
    fn labels_and_table_order() {
        let labels: Vec<_> = Timer::ALL.iter().map(|t| t.as_str()).collect();
        assert_eq!(
            labels,
            [
                "epoch_end",
                "vm_boot",
                "keep_alive",
                "queue_wait",
                "delay_queue",
                "r_max"
            ]
        );
        // Every row is its own: setting one leaves the others empty.
        for t in Timer::ALL {
            let mut table = TimerTable::new();
            table.set(t, Some(Duration::from_millis(5)));
            for u in Timer::ALL {
                assert_eq!(table.get(u).is_some(), u == t, "{t:?} / {u:?}");
            }
            assert_eq!(table.next(), Some((t, Duration::from_millis(5))));
        }
        // The last row wins when it is the earliest.
        let mut table = TimerTable::new();
        table.set(Timer::EpochEnd, Some(Duration::from_secs(3)));
        table.set(Timer::RMax, Some(Duration::from_secs(2)));
        assert_eq!(table.next(), Some((Timer::RMax, Duration::from_secs(2))));
    }
}
