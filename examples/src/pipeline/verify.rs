//! `pipeline verify` (C): reads the last ring of the pipeline and checks every word of every frame end to end:
//! frame `n` must be the generator's frame of upstream number `u = u0 + n`, XORed with `--xor`, i.e. the pattern
//! frame of `xor_sequence(u, mask)` (docs/kernels.md). A frame lost, repeated, stale or torn on the way, or
//! transformed wrongly, fails in every word.
//!
//! Which upstream frame the first frame of an attachment is (`u0`): `--first-upstream N` for the first attachment
//! (a pipeline started fresh: 0), else read from that frame, whose first word names it (`sequence_of_first_word`):
//! after the middle stage is replaced, `u0` is wherever the new stage joined the generator. A frame whose number is
//! read from itself is checked against that number, so what it cannot show is a wrong mask on that one frame; every
//! frame after it is checked against the numbers that follow. Across attachments upstream numbers must only grow.
//!
//! With `--reattach`, when its producer (the middle stage) dies it says so and attaches again, up to
//! `--attach-timeout`, to whoever serves the socket next.

use std::time::{Duration, Instant};

use gpu_ipc::core::backend::Backend;
use gpu_ipc::core::frames::{AttachOptions, Consumer, FrameError};
use gpu_ipc::kernels::pattern::{sequence_of_first_word, xor_sequence};

use super::{mask_name, parse_mask};
use crate::work::{FrameWork, ProgramVisitor, run_with_backend};
use crate::{CommonArgs, fps};

/// Options of `pipeline verify`.
#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// `--socket` and `--backend` are the ring it reads (the last stage's).
    #[command(flatten)]
    pub common: CommonArgs,
    /// The mask the stages before it XORed each word with, all together (0xffffffff: one inverting stage).
    #[arg(long, default_value = "0xffffffff", value_parser = parse_mask)]
    pub xor: u32,
    /// The upstream number of the first frame it reads (a pipeline started fresh, this stage attached before the
    /// first frame: 0) [default: read from the frame]. Attachments after the first always read it from the frame.
    #[arg(long, value_name = "N")]
    pub first_upstream: Option<u64>,
    /// Frames to verify (0: until the end of the stream).
    #[arg(long, default_value_t = 0)]
    pub frames: u64,
    /// When its producer dies, attach again (waiting up to --attach-timeout for a new one) instead of exiting 4.
    #[arg(long)]
    pub reattach: bool,
    /// A name for its lines (`verify NAME: ...`) and the producer's logs.
    #[arg(long)]
    pub name: Option<String>,
    /// Print `verify: frame N (upstream U)` on stderr every N frames (0: never).
    #[arg(long, default_value_t = 0)]
    pub progress_every: u64,
}

/// One attachment's frames.
#[derive(Debug, serde::Serialize)]
pub struct Attachment {
    /// Its first frame's number in the ring it read.
    pub first_downstream: u64,
    /// The upstream number of its first frame (read from the frame), when it verified any.
    pub first_upstream: Option<u64>,
    /// The upstream number of its last frame verified.
    pub last_upstream: Option<u64>,
    /// Frames verified (published by its producer).
    pub frames: u64,
    /// Words that did not hold what they should.
    pub mismatched_words: u64,
    /// Frames it took that its producer never published (a GPU-side wait released by the end of the stream or the
    /// producer's death): not checked, not counted.
    pub discarded: u64,
    /// How it ended: `end of stream after N frames`, `the producer (pid P) is gone: ...`, or `frames done`.
    pub ended: String,
}

/// What `pipeline verify` prints.
#[derive(Debug, serde::Serialize)]
pub struct VerifySummary {
    /// `verify`.
    pub role: &'static str,
    /// How its lines start: `verify`, or `verify NAME` with `--name`.
    pub name: String,
    /// The ring's backend.
    pub backend: &'static str,
    /// The ring's sync strategy (the last stage's choice).
    pub sync: &'static str,
    /// The mask expected, as `0xffffffff`.
    pub xor: String,
    /// Frames verified, over every attachment.
    pub frames: u64,
    /// Mismatched words, over every attachment (must be 0).
    pub mismatched_words: u64,
    /// Attachments whose first upstream frame was not after the previous one's last (must be 0).
    pub out_of_order: u64,
    /// Every attachment, in order.
    pub attachments: Vec<Attachment>,
    /// When the stream ended cleanly: the frames its producer published.
    pub end_of_stream_after: Option<u64>,
    /// When it ended because its producer died (and no other came back, with `--reattach`): what it saw.
    pub producer_gone: Option<String>,
    /// Seconds from the first attach to the end.
    pub seconds: f64,
    /// Frames per second over them.
    pub fps: f64,
}

/// Runs `pipeline verify`.
///
/// # Errors
/// No producer at the start, and any error of the ring other than its end or its producer's death.
pub fn verify(args: VerifyArgs) -> Result<VerifySummary, FrameError> {
    run_with_backend(args.common.backend, Verify(args))
}

/// How one attachment ended.
enum Outcome {
    /// The stream ended cleanly after this many frames.
    Ended(u64),
    /// The producer died; what was seen.
    Gone(String),
    /// `--frames` were verified.
    Done,
}

struct Verify(VerifyArgs);

impl ProgramVisitor for Verify {
    type Output = VerifySummary;

    fn run<B: Backend, W: FrameWork<B>>(self) -> Result<VerifySummary, FrameError> {
        let args = self.0;
        let mut work = W::open(args.common.device)?;
        let patience = Duration::from_secs(args.common.attach_timeout);
        let label = args.name.as_deref().map_or_else(|| "verify".to_owned(), |name| format!("verify {name}"));
        let options = AttachOptions { name: label.clone(), wait_for_producer: patience, ..AttachOptions::default() };
        let t0 = Instant::now();
        let (mut attachments, mut sync): (Vec<Attachment>, Option<&'static str>) = (Vec::new(), None);
        let (mut frames, mut out_of_order, mut end, mut gone) = (0u64, 0u64, None, None);
        loop {
            let mut consumer = match Consumer::<B>::attach(work.ctx(), &args.common.socket, &options) {
                Ok(consumer) => consumer,
                // Attaching again after a death: nobody came back in time.
                Err(e) if gone.is_some() => {
                    eprintln!("{label}: no producer came back: {e}");
                    break;
                }
                Err(e) => return Err(e),
            };
            sync.get_or_insert(consumer.offer().sync.name());
            eprintln!(
                "{label}: attached (attachment {}); its first frame is number {}",
                attachments.len() + 1,
                consumer.next_sequence()
            );
            let known = if attachments.is_empty() { args.first_upstream } else { None };
            let (attachment, outcome) = read_attachment(&args, &label, known, &mut work, &mut consumer, frames)?;
            let previous_last = attachments.iter().rev().find_map(|a: &Attachment| a.last_upstream);
            if let (Some(last), Some(first)) = (previous_last, attachment.first_upstream)
                && first <= last
            {
                out_of_order += 1;
                eprintln!("{label}: upstream frame {first} came after upstream frame {last}");
            }
            frames += attachment.frames;
            attachments.push(attachment);
            match outcome {
                Outcome::Ended(published) => {
                    consumer.detach();
                    end = Some(published);
                    gone = None;
                    break;
                }
                Outcome::Done => {
                    consumer.detach();
                    gone = None;
                    break;
                }
                Outcome::Gone(what) => {
                    if !args.reattach {
                        eprintln!("{label}: {what}");
                        gone = Some(what);
                        break;
                    }
                    eprintln!("{label}: {what}; attaching again (up to {}s)", patience.as_secs());
                    gone = Some(what);
                }
            }
        }
        let elapsed = t0.elapsed();
        Ok(VerifySummary {
            role: "verify",
            name: label,
            backend: B::KIND.name(),
            sync: sync.unwrap_or("unknown"),
            xor: mask_name(args.xor),
            frames,
            mismatched_words: attachments.iter().map(|a| a.mismatched_words).sum(),
            out_of_order,
            attachments,
            end_of_stream_after: end,
            producer_gone: gone,
            seconds: elapsed.as_secs_f64(),
            fps: fps(frames, elapsed),
        })
    }
}

/// Reads and checks frames of one attachment until the stream ends, the producer dies or `--frames` are done.
/// `known`: the upstream number of its first frame, when known; `before`: frames verified in earlier attachments.
fn read_attachment<B: Backend, W: FrameWork<B>>(
    args: &VerifyArgs,
    label: &str,
    known: Option<u64>,
    work: &mut W,
    consumer: &mut Consumer<B>,
    before: u64,
) -> Result<(Attachment, Outcome), FrameError> {
    let timeout = Duration::from_secs(10);
    work.reset_mismatches()?;
    let first = consumer.next_sequence();
    // Upstream number of frame `first`: known, or read from the frame itself.
    let mut first_upstream = known;
    let (mut taken, mut last_taken) = (0u64, None);
    let outcome = loop {
        if args.frames != 0 && before + taken >= args.frames {
            break Outcome::Done;
        }
        let step = consumer.next_frame(work.stream(), timeout).and_then(|frame| {
            let seq = frame.seq().0;
            let base = match first_upstream {
                Some(base) => base,
                None => {
                    let word = work.first_word(consumer, &frame)?;
                    *first_upstream.insert(xor_sequence(sequence_of_first_word(word), args.xor))
                }
            };
            let upstream = base + (seq - first);
            work.verify_as(consumer, &frame, xor_sequence(upstream, args.xor))?;
            consumer.release(frame, work.stream()).map(|()| (seq, upstream))
        });
        match step {
            Ok((seq, upstream)) => {
                taken += 1;
                last_taken = Some(seq);
                let done = before + taken;
                if args.progress_every != 0 && done.is_multiple_of(args.progress_every) {
                    eprintln!("{label}: frame {done} (upstream {upstream})");
                }
            }
            Err(FrameError::EndOfStream { published, .. }) => break Outcome::Ended(published),
            Err(FrameError::ProducerGone { pid, how }) => {
                break Outcome::Gone(format!("the producer (pid {pid}) is gone: {how}"));
            }
            Err(e) => return Err(e),
        }
    };
    work.synchronize()?;
    // Frames numbered `real_below` and above were never published: their GPU-side waits were released by the end
    // of the stream or by the producer's death, and what was read from them is not counted.
    let real_below = match &outcome {
        Outcome::Ended(published) => *published,
        Outcome::Gone(_) => consumer.published_below_at_hang_up().unwrap_or(u64::MAX),
        Outcome::Done => u64::MAX,
    };
    let last_real =
        last_taken.zip(real_below.checked_sub(1)).map(|(taken, cap)| taken.min(cap)).filter(|&l| l >= first);
    let frames = last_real.map_or(0, |last| last - first + 1);
    let ended = match &outcome {
        Outcome::Ended(published) => format!("end of stream after {published} frames"),
        Outcome::Gone(what) => what.clone(),
        Outcome::Done => "frames done".to_owned(),
    };
    let attachment = Attachment {
        first_downstream: first,
        first_upstream: first_upstream.filter(|_| frames > 0),
        last_upstream: last_real.zip(first_upstream).map(|(last, base)| base + (last - first)),
        frames,
        mismatched_words: match last_real {
            Some(last) => work.mismatches(Some(last))?,
            None => 0,
        },
        discarded: taken.saturating_sub(frames),
        ended,
    };
    Ok((attachment, outcome))
}
