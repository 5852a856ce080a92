//! Text in and out (being written).
