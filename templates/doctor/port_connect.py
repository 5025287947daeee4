# From a node, connect to the head's rendezvous port: argv HOST PORT TIMEOUT. Prints open,
# timeout (a DROP), refused (a REJECT, or nothing listening) or error; "refused" is
# retried until the deadline, since the listener may still be starting.
import socket
import sys
import time

# The listener starts as the probes do, so the first try often comes before it listens:
# a short step (a refused connect costs one local round trip) shortens that wait.
RETRY_S = 0.05

host, port, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.time() + limit
while True:
    try:
        socket.create_connection((host, port), timeout=max(0.1, deadline - time.time())).close()
        print("open")
    except TimeoutError:
        print("timeout")
    except ConnectionRefusedError:
        if time.time() + RETRY_S < deadline:
            time.sleep(RETRY_S)
            continue
        print("refused")
    except OSError as error:
        print("error", error.strerror or error)
    break
