package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// The one place that knows store.wait_replicas: a write followed, on the
// same connection, by WAIT. Every claim and fenced write goes through
// write (native commands) or evalWrite (scripts); without WAIT they go
// through exec, coalesced with other operations.

// write runs cmds, one operation's writes to key, then WAIT on the same
// connection when enabled; wait is nil otherwise. An error is ctx's or the
// connection's: then cmds hold no result.
func (s *Store) write(ctx context.Context, key string, size int, cmds ...redis.Cmder) (wait *redis.Cmd, err error) {
	if s.waitReplicas <= 0 {
		return nil, s.exec(ctx, size, cmds...)
	}
	pipe, err := s.writePipeline(ctx, key)
	if err != nil {
		return nil, err
	}
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	wait = s.wait(ctx, pipe)
	_, _ = pipe.Exec(ctx)
	return wait, nil
}

// evalWrite runs script on key (by SHA, by source after NOSCRIPT), then
// WAIT on the same connection when enabled; wait is nil otherwise.
func (s *Store) evalWrite(ctx context.Context, script *redis.Script, key string, size int, args ...any) (run, wait *redis.Cmd) {
	if s.waitReplicas <= 0 {
		return s.eval(ctx, script, key, size, args...), nil
	}
	return s.runAndWait(ctx, script, key, args...)
}

// writePipeline returns a pipeline on which a write to key and the WAIT
// after it share one connection, as WAIT counts only the writes made on
// its own connection: on a Cluster the pipeline of the key's master (the
// Cluster client would send a keyless WAIT to any node), elsewhere the
// client's.
func (s *Store) writePipeline(ctx context.Context, key string) (redis.Pipeliner, error) {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Pipeline(), nil
	}
	return s.client.Pipeline(), nil
}

// wait queues a WAIT on pipe, after the write it follows, when enabled.
func (s *Store) wait(ctx context.Context, pipe redis.Pipeliner) *redis.Cmd {
	if s.waitReplicas <= 0 {
		return nil
	}
	return pipe.Do(ctx, "WAIT", s.waitReplicas, s.waitTimeout.Milliseconds())
}

// checkWait reports a WAIT that fewer replicas than asked acknowledged.
func (s *Store) checkWait(op string, cmd *redis.Cmd) {
	if cmd == nil {
		return
	}
	if n, err := cmd.Int(); (err != nil || n < s.waitReplicas) && s.onWaitShort != nil {
		s.onWaitShort(op)
	}
}

// runAndWait runs script and WAIT in one pipeline, so WAIT follows the
// write on its connection. A Redis that lost its script cache (a restart,
// a failover) gets the script loaded and the pipeline resent. The caller
// passes wait to checkWait when the script wrote.
func (s *Store) runAndWait(ctx context.Context, script *redis.Script, key string, args ...any) (run, wait *redis.Cmd) {
	for attempt := 0; ; attempt++ {
		pipe, err := s.writePipeline(ctx, key)
		if err != nil {
			return redis.NewCmdResult(nil, err), nil
		}
		run = pipe.EvalSha(ctx, script.Hash(), []string{key}, args...)
		wait = s.wait(ctx, pipe)
		_, _ = pipe.Exec(ctx)
		if err := run.Err(); attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if err := script.Load(ctx, s.client).Err(); err != nil {
				return redis.NewCmdResult(nil, err), nil
			}
			continue
		}
		return run, wait
	}
}
