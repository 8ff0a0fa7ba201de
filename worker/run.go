package worker

import (
	"context"
	"errors"
	"fmt"
)

// Run trains until train returns nil, surviving what elastic training must survive:
//
//   - a lost peer (allreduce.ErrPeerLost and other communicator errors): restore the last
//     commit, reset, sync from rank 0, train again;
//   - ErrHostsUpdated (from State.Commit/Step): reset without restoring — every rank stopped
//     at the same step with the same state — sync, train again.
//
// Any other error from train ends Run with it. Run returns ErrRemoved when the driver gives
// this worker no place in the next generation; the process should then exit 0.
func Run(ctx context.Context, w *Worker, s *State, train func(ctx context.Context) error) error {
	for {
		err := s.Sync(ctx)
		if err == nil {
			if err = train(ctx); err == nil {
				return nil
			}
		}
		switch {
		case errors.Is(err, ErrHostsUpdated):
			w.log.Info("hosts changed; resetting", "generation", w.Generation(), "rank", w.Rank())
		case commError(err) && ctx.Err() == nil:
			w.log.Warn("peer lost; restoring the last commit and resetting", "generation", w.Generation(), "rank", w.Rank(), "err", err)
			if rerr := s.Restore(); rerr != nil {
				return fmt.Errorf("restore after %v: %w", err, rerr)
			}
		default:
			return err
		}
		if err := w.reset(ctx, err); err != nil {
			return err
		}
	}
}
