// Command fiberpeer is the in-app peer of the benchmark: a Fiber v2
// application with Fiber's idempotency middleware on Redis (the most-used Go
// alternative to idemproxy, which runs inside the application, with no extra
// hop), in front of the same handler as the benchmark's upstream: the same
// 1 KiB answer after -delay. It is its own module, so that the sidecar's
// go.mod does not carry Fiber.
package main

import (
	"flag"
	"log"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	"github.com/gofiber/storage/redis/v3"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "")
	delay := flag.Duration("delay", 0, "service time")
	flag.Parse()
	host, port, _ := strings.Cut(*redisAddr, ":")
	p, _ := strconv.Atoi(port)
	store := redis.New(redis.Config{Host: host, Port: p, PoolSize: 64})
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(idempotency.New(idempotency.Config{
		Lifetime:  24 * time.Hour,
		KeyHeader: "Idempotency-Key",
		Storage:   store,
		// Keys as idemproxy accepts them (the default wants 36 characters).
		KeyHeaderValidate: func(k string) error {
			if k == "" || len(k) > 255 {
				return fiber.ErrBadRequest
			}
			return nil
		},
	}))
	answer := []byte(`{"id":"ch_0000000001","object":"charge","amount":1250,"currency":"eur","status":"succeeded","description":"` + strings.Repeat("x", 860) + `","metadata":{"order":"42"}}`)
	app.Post("/payments", func(c *fiber.Ctx) error {
		if *delay > 0 {
			time.Sleep(*delay)
		}
		c.Set("Content-Type", "application/json")
		return c.Status(fiber.StatusCreated).Send(answer)
	})
	log.Fatal(app.Listen(*listen))
}
