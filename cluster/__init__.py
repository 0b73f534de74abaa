"""Scale-out on Ray Serve: ``veil serve --replicas N`` (install the ``cluster`` extra).

Layout of one application (``veil``) on a Ray cluster:

    HTTP ─► Ray Serve proxy ─► Ingress (1 replica) ──DeploymentHandle──► VeilReplica × N
                                 routes, /health, /metrics                each: the whole single-process
                                                                          app (engine, sessions, protected)

* **The API is the single-process one by construction.** Every engine replica runs the same
  FastAPI app as ``veil serve`` does, in process (``asgi.call_app``); the ingress forwards each
  request (method, path, headers, body) and streams the answer back. Only ``/health`` and
  ``/metrics`` are the ingress's own: they gather every replica's.
* **Affinity by session id.** A replica prefixes the ids of the sessions it creates with its Ray
  replica id (``<replica>.<192 random bits>``). The ingress reads the prefix from
  ``/v1/sessions/{id}…`` and passes it to the handle call; ``router.SessionAffinityRouter``, the
  deployment's request router, sends the call to exactly that replica.
* **Sessions placed by count.** A session lives on one replica, so ``POST /v1/sessions`` goes to
  the replica holding the fewest live sessions on the new one's path: each replica reports its
  counts to Ray (routing stats), and the router adds the sessions it opened since.
* **Balance for the rest.** Everything else without a session (completions, key uploads): power
  of two choices on the replicas' loads, as Ray Serve's default router does, with a load that
  also counts the requests chosen or sent but not yet acknowledged (``router`` says why).
* **Replica loss.** Ray restarts a dead replica under a new replica id. A request pinned to an id
  no longer running is routed to a live replica, which does not know the session and answers
  404 ``session_not_found``, so the SDK opens a new session and prefills again (as after a server
  restart). A request that was running on the replica when it died answers 404
  ``session_not_found`` when pinned, 503 ``replica_lost`` otherwise; a completion that was
  already streaming ends with an error event. Ray's router drops the dead replica as soon as a
  call to it fails, so new work goes to the live ones.
* **Evaluation keys, uploaded once per tenant.** The replica that validates ``POST /v1/keys``
  also stores the uploaded bytes in ``keys.KeyStore``, an actor shared by the deployment's
  replicas (a Ray Serve deployment-scoped actor: it outlives replicas). A replica asked to open a
  protected session with keys it has not imported fetches them from the store and imports them
  first. Each replica that serves a tenant's protected sessions holds its own imported copy.
  ``DELETE /v1/keys/{id}`` drops the store's copy and that replica's; each copy, and the
  store's, also goes once no session has named it for ``key_ttl_s`` (``keys.KeyStore``).
"""
