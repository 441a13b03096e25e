//! The resume and dedup rules of a subscription, free of I/O so they are tested without
//! sockets.

use crate::endpoint::Cursor;
use crate::error::Error;
use crate::types::{ControlFrame, Message, ServerFrame};

use super::Event;

/// What the tracker decided about one frame.
#[derive(Debug)]
pub(crate) enum Step {
    /// Nothing to deliver (a duplicate, a known-only control frame).
    Skip,
    /// Deliver this event.
    Emit(Event),
    /// Report the gap, then deliver the event.
    Gap { error: Error, then: Event },
    /// Deliver this event and end the stream.
    End(Event),
}

/// The resume and dedup rules of a subscription, free of I/O.
///
/// # Correctness
/// After each `on_frame`, `last_delivered` is the highest sequence the stream has delivered
/// or declared expired; every later message is delivered only if its sequence is above it.
#[derive(Debug)]
pub(crate) struct Tracker {
    /// The topic, for error reports.
    topic: String,
    /// The cursor the application asked for; used while nothing is delivered yet.
    initial: Cursor,
    /// The highest sequence delivered or skipped by `messages_expired`; `None` until the
    /// first `subscribed` frame of a `Latest`/`Acked` subscription names it.
    last_delivered: Option<u64>,
}

impl Tracker {
    pub(crate) fn new(topic: &str, cursor: Cursor) -> Tracker {
        Tracker {
            topic: topic.to_string(),
            initial: cursor,
            last_delivered: match cursor {
                Cursor::After(n) => Some(n),
                Cursor::Latest | Cursor::Acked => None,
            },
        }
    }

    /// The cursor to reconnect with: the last delivered sequence once there is one.
    pub(crate) fn resume_cursor(&self) -> Cursor {
        match self.last_delivered {
            Some(n) => Cursor::After(n),
            None => self.initial,
        }
    }

    /// A `subscribed` frame's effective cursor. On the first connect of a Latest or Acked
    /// subscription it is where the stream starts; afterwards the cursor is ours.
    pub(crate) fn on_subscribed(&mut self, cursor: u64) {
        if self.last_delivered.is_none() {
            self.last_delivered = Some(cursor);
        }
    }

    pub(crate) fn on_frame(&mut self, frame: ServerFrame) -> Step {
        match frame {
            ServerFrame::Message(message) => self.on_message(message),
            ServerFrame::Control(ControlFrame::Subscribed { cursor }) => {
                self.on_subscribed(cursor);
                Step::Skip
            }
            ServerFrame::Control(ControlFrame::MessagesExpired { requested_cursor, first_available_sequence }) => {
                let floor = first_available_sequence.saturating_sub(1);
                match self.last_delivered {
                    // Everything that expired was delivered before: nothing lost for us.
                    Some(last) if floor <= last => Step::Skip,
                    _ => {
                        self.last_delivered = Some(floor);
                        Step::Emit(Event::Expired { requested_cursor, first_available_sequence })
                    }
                }
            }
            ServerFrame::Control(ControlFrame::TopicDeleted) => Step::End(Event::TopicDeleted),
            ServerFrame::Control(ControlFrame::LeaderChange { new_leader, new_leader_id }) => {
                Step::Emit(Event::LeaderChange { new_leader, new_leader_id })
            }
            ServerFrame::Control(ControlFrame::AcksNotRecorded { recorded_cursors_max }) => {
                Step::Emit(Event::AcksNotRecorded { recorded_cursors_max })
            }
            ServerFrame::Control(ControlFrame::Unknown) | ServerFrame::Unknown => Step::Skip,
        }
    }

    fn on_message(&mut self, message: Message) -> Step {
        let sequence = message.sequence;
        match self.last_delivered {
            Some(last) if sequence <= last => Step::Skip,
            Some(last) if sequence > last + 1 => {
                self.last_delivered = Some(sequence);
                Step::Gap {
                    error: Error::SequenceGap { topic: self.topic.clone(), last_delivered: last, received: sequence },
                    then: Event::Message(message),
                }
            }
            _ => {
                self.last_delivered = Some(sequence);
                Step::Emit(Event::Message(message))
            }
        }
    }
}
