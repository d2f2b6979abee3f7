/* Every route of smeltd's HTTP API, in matching order (docs/api.md). */
#include "server/tinker_api.h"

const struct http_route SERVER_ROUTES[] = {
    {"GET", "/healthz", api_healthz, HTTP_PUBLIC},
    {"GET", "/metrics", api_metrics, 0},
    {"GET", "/v1/openapi.json", api_openapi, HTTP_PUBLIC},

    {"POST", "/v1/files", api_files_create, HTTP_LARGE_BODY},
    {"GET", "/v1/files", api_files_list, 0},
    {"GET", "/v1/files/{file_id}", api_files_get, 0},
    {"DELETE", "/v1/files/{file_id}", api_files_delete, 0},
    {"GET", "/v1/files/{file_id}/content", api_files_content, 0},

    {"POST", "/v1/fine_tuning/jobs", api_jobs_create, 0},
    {"GET", "/v1/fine_tuning/jobs", api_jobs_list, 0},
    {"GET", "/v1/fine_tuning/jobs/{job_id}", api_jobs_get, 0},
    {"POST", "/v1/fine_tuning/jobs/{job_id}/cancel", api_jobs_cancel, 0},
    {"POST", "/v1/fine_tuning/jobs/{job_id}/pause", api_jobs_pause, 0},
    {"POST", "/v1/fine_tuning/jobs/{job_id}/resume", api_jobs_resume, 0},
    {"GET", "/v1/fine_tuning/jobs/{job_id}/events", api_jobs_events, 0},
    {"GET", "/v1/fine_tuning/jobs/{job_id}/checkpoints", api_jobs_checkpoints, 0},
    {"GET", "/v1/fine_tuning/jobs/{job_id}/metrics", api_jobs_metrics, 0},
    {"GET", "/v1/fine_tuning/jobs/{job_id}/logs", api_jobs_logs, 0},

    {"POST", "/v1/fine_tuning/alpha/graders/validate", api_graders_validate, 0},
    {"POST", "/v1/fine_tuning/alpha/graders/run", api_graders_run, 0},

    {"POST", "/v1/fine_tuning/schedules", api_schedules_create, 0},
    {"GET", "/v1/fine_tuning/schedules", api_schedules_list, 0},
    {"GET", "/v1/fine_tuning/schedules/{schedule_id}", api_schedules_get, 0},
    {"POST", "/v1/fine_tuning/schedules/{schedule_id}", api_schedules_update, 0},
    {"DELETE", "/v1/fine_tuning/schedules/{schedule_id}", api_schedules_delete, 0},
    {"POST", "/v1/fine_tuning/schedules/{schedule_id}/trigger", api_schedules_trigger, 0},
    {"GET", "/v1/fine_tuning/schedules/{schedule_id}/runs", api_schedules_runs, 0},

    {"GET", "/v1/models", api_models_list, 0},
    {"GET", "/v1/models/{model}", api_models_get, 0},

    {"GET", "/v1/cluster", api_cluster, 0},
    {"POST", "/v1/cluster/agent_credentials", api_agent_credentials_create, HTTP_ADMIN},
    {"GET", "/v1/cluster/agent_credentials", api_agent_credentials_list, HTTP_ADMIN},
    {"POST", "/v1/cluster/agent_credentials/{credential_id}/revoke", api_agent_credentials_revoke, HTTP_ADMIN},
    {"POST", "/v1/cluster/agent_credentials/{credential_id}/rotate", api_agent_credentials_rotate, HTTP_ADMIN},

    {"POST", "/v1/api_keys", api_keys_create, HTTP_ADMIN},
    {"GET", "/v1/api_keys", api_keys_list, HTTP_ADMIN},
    {"DELETE", "/v1/api_keys/{key_id}", api_keys_delete, HTTP_ADMIN},

    /* the Tinker SDK's API (docs/tinker.md; keys also as "X-API-Key: tml-<key>") */
    {"GET", "/api/v1/healthz", api_tinker_healthz, HTTP_PUBLIC},
    {"POST", "/api/v1/client/config", api_tinker_client_config, 0},
    {"POST", "/api/v1/client/dynamic_config", api_tinker_dynamic_config, 0},
    {"POST", "/api/v1/telemetry", api_tinker_telemetry, 0},
    {"POST", "/api/v1/create_session", api_tinker_create_session, 0},
    {"POST", "/api/v1/session_heartbeat", api_tinker_heartbeat, 0},
    {"POST", "/api/v1/sessions/{session_id}/finish", api_tinker_finish, 0},
    {"GET", "/api/v1/get_server_capabilities", api_tinker_capabilities, 0},
    {"POST", "/api/v1/create_model", api_tinker_create_model, 0},
    {"POST", "/api/v1/get_info", api_tinker_get_info, 0},
    {"POST", "/api/v1/forward_backward", api_tinker_forward_backward, HTTP_LARGE_BODY},
    {"POST", "/api/v1/optim_step", api_tinker_optim_step, 0},
    {"POST", "/api/v1/save_weights", api_tinker_save_weights, 0},
    {"POST", "/api/v1/save_weights_for_sampler", api_tinker_save_for_sampler, 0},
    {"POST", "/api/v1/load_weights", api_tinker_load_weights, 0},
    {"POST", "/api/v1/create_sampling_session", api_tinker_create_sampler, 0},
    {"GET", "/api/v1/samplers/{sampling_session_id}", api_tinker_get_sampler, 0},
    {"POST", "/api/v1/asample", api_tinker_asample, 0},
    {"POST", "/api/v1/retrieve_future", api_tinker_retrieve_future, 0},
    {"POST", "/api/v1/cancel_future", api_tinker_cancel_future, 0},
    {"GET", "/api/v1/training_runs", api_tinker_runs_list, 0},
    {"GET", "/api/v1/training_runs/{training_run_id}", api_tinker_run_get, 0},
    {"GET", "/api/v1/training_runs/{training_run_id}/checkpoints", api_tinker_checkpoints, 0},
    {"DELETE", "/api/v1/training_runs/{training_run_id}/checkpoints/{segment}/{name}", api_tinker_checkpoint_delete, 0},
    {"POST", "/api/v1/weights_info", api_tinker_weights_info, 0},

    {"GET", "/", api_static, HTTP_PUBLIC},
    {"GET", "/*", api_static, HTTP_PUBLIC},
};
const int SERVER_N_ROUTES = (int)(sizeof SERVER_ROUTES / sizeof SERVER_ROUTES[0]);
