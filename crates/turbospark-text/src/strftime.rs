//! `strftime_now` for chat templates: the current date formatted like
//! Python's `datetime.now().strftime(fmt)`. It owns the calendar arithmetic
//! and the format directives; it must not know about templates.
//!
//! Times are UTC: without a time-zone database we cannot know the local
//! zone, and inference servers run in UTC nearly always. Python's `now()` is
//! naive, so `%z` and `%Z` print nothing, as they do there.

use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Seconds since the Unix epoch now; a clock before 1970 counts as 1970.
pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A broken-down UTC time.
struct Civil {
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    /// 1..=366
    yday: u32,
    /// 0 = Sunday
    wday: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

impl Civil {
    fn from_unix(secs: i64) -> Civil {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        // Howard Hinnant's days-to-civil algorithm (proleptic Gregorian).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let before: u32 = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
            .iter()
            .take(month as usize - 1)
            .sum();
        let leap_day = u32::from(month > 2 && is_leap(year));
        Civil {
            year,
            month,
            day,
            yday: before + leap_day + day,
            wday: (days + 4).rem_euclid(7) as u32,
            hour: (rem / 3600) as u32,
            minute: (rem / 60 % 60) as u32,
            second: (rem % 60) as u32,
        }
    }
}

/// Formats the UTC time `unix_secs` with Python/glibc `strftime` directives,
/// including glibc's `%-d` (no padding). Unknown directives are printed as
/// they are, as glibc does.
pub(crate) fn strftime(fmt: &str, unix_secs: i64) -> String {
    let t = Civil::from_unix(unix_secs);
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut directive = chars.next();
        let pad = directive != Some('-');
        if !pad {
            directive = chars.next();
        }
        let num = |n: u32, width: usize| {
            if pad {
                format!("{n:0width$}")
            } else {
                n.to_string()
            }
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        let day_name = DAYS[t.wday as usize];
        let month_name = MONTHS[t.month as usize - 1];
        let piece = match directive {
            Some('a') => day_name[..3].to_string(),
            Some('A') => day_name.to_string(),
            Some('w') => t.wday.to_string(),
            Some('u') => (if t.wday == 0 { 7 } else { t.wday }).to_string(),
            Some('d') => num(t.day, 2),
            Some('e') => format!("{:2}", t.day),
            Some('b' | 'h') => month_name[..3].to_string(),
            Some('B') => month_name.to_string(),
            Some('m') => num(t.month, 2),
            Some('y') => num(t.year.rem_euclid(100) as u32, 2),
            Some('Y') => t.year.to_string(),
            Some('H') => num(t.hour, 2),
            Some('I') => num(hour12, 2),
            Some('p') => (if t.hour < 12 { "AM" } else { "PM" }).to_string(),
            Some('M') => num(t.minute, 2),
            Some('S') => num(t.second, 2),
            Some('f') => "000000".to_string(),
            Some('j') => num(t.yday, 3),
            Some('z' | 'Z') => String::new(),
            Some('D' | 'x') => strftime("%m/%d/%y", unix_secs),
            Some('F') => strftime("%Y-%m-%d", unix_secs),
            Some('T' | 'X') => strftime("%H:%M:%S", unix_secs),
            Some('R') => strftime("%H:%M", unix_secs),
            Some('c') => strftime("%a %b %e %H:%M:%S %Y", unix_secs),
            Some('n') => "\n".to_string(),
            Some('t') => "\t".to_string(),
            Some('%') => "%".to_string(),
            Some(other) => format!("%{}{other}", if pad { "" } else { "-" }),
            None => format!("%{}", if pad { "" } else { "-" }),
        };
        out.push_str(&piece);
    }
    out
}
