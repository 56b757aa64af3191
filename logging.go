package main

import (
	"context"
	"log/slog"
)

// leveled filters a handler by a level that a reload can change.
type leveled struct {
	next  slog.Handler
	level *slog.LevelVar
}

func (h leveled) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level.Level() && h.next.Enabled(ctx, l)
}

func (h leveled) Handle(ctx context.Context, r slog.Record) error { return h.next.Handle(ctx, r) }

func (h leveled) WithAttrs(as []slog.Attr) slog.Handler {
	return leveled{next: h.next.WithAttrs(as), level: h.level}
}

func (h leveled) WithGroup(name string) slog.Handler {
	return leveled{next: h.next.WithGroup(name), level: h.level}
}
