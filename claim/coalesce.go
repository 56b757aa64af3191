package claim

import (
	"slices"
	"sync"
)

// Queue is the group commit both backends share (redisstore's and
// pgstore's batch.go): an operation goes at once while fewer than Max
// batches are out (a lone request pays no hand-off and no timer), and
// queues otherwise; when a batch comes back, what queued meanwhile goes
// out together as the next batch, bounded in operations and bytes. T is
// a backend's pending operation; Size says about how many bytes it
// carries.
type Queue[T comparable] struct {
	// Max is how many batches may be out at once; MaxOps and MaxBytes
	// bound one batch (an operation larger than MaxBytes goes alone).
	Max, MaxOps, MaxBytes int
	Size                  func(T) int

	mu       sync.Mutex
	queue    []T
	inFlight int
}

// Admit reports whether op may be sent at once, as a batch of its own
// that its caller runs and ends with Next; otherwise op is queued, for a
// later Next to hand out.
func (q *Queue[T]) Admit(op T) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.inFlight < q.Max {
		q.inFlight++
		return true
	}
	q.queue = append(q.queue, op)
	return false
}

// Withdraw takes op off the queue, and reports whether it was still
// there (not sent): its caller gave up waiting.
func (q *Queue[T]) Withdraw(op T) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.Index(q.queue, op)
	if i < 0 {
		return false
	}
	q.queue = slices.Delete(q.queue, i, i+1)
	return true
}

// Counts is how many batches are out and how many operations queue.
func (q *Queue[T]) Counts() (inFlight, queued int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.inFlight, len(q.queue)
}

// Next is called when a batch came back: the next batch off the queue,
// for the caller to send (and end with Next again), or nil, one batch
// fewer out, when nothing queued.
func (q *Queue[T]) Next() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) == 0 {
		q.inFlight--
		return nil
	}
	n, size := 0, 0
	for n < len(q.queue) && n < q.MaxOps && (n == 0 || size+q.Size(q.queue[n]) <= q.MaxBytes) {
		size += q.Size(q.queue[n])
		n++
	}
	batch := slices.Clone(q.queue[:n])
	q.queue = slices.Delete(q.queue, 0, n)
	return batch
}
