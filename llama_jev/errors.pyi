"""Every error llama_jev raises, from the base class ``JevError`` down. Catch ``JevError`` for all of them."""

from llama_jev.calibration.records import (
    CalibrationInputError as CalibrationInputError,
)
from llama_jev.calibration.records import (
    InsufficientLabelsError as InsufficientLabelsError,
)
from llama_jev.calibration.records import (
    MixedRecordsError as MixedRecordsError,
)
from llama_jev.core.errors import (
    CandidateTooLargeError as CandidateTooLargeError,
)
from llama_jev.core.errors import (
    EvidenceTooLargeError as EvidenceTooLargeError,
)
from llama_jev.core.errors import (
    JevAPIError as JevAPIError,
)
from llama_jev.core.errors import (
    JevAuthenticationError as JevAuthenticationError,
)
from llama_jev.core.errors import (
    JevBadRequestError as JevBadRequestError,
)
from llama_jev.core.errors import (
    JevConnectionError as JevConnectionError,
)
from llama_jev.core.errors import (
    JevError as JevError,
)
from llama_jev.core.errors import (
    JevInvalidResponseError as JevInvalidResponseError,
)
from llama_jev.core.errors import (
    JevNotFoundError as JevNotFoundError,
)
from llama_jev.core.errors import (
    JevOverloadedError as JevOverloadedError,
)
from llama_jev.core.errors import (
    JevPermissionDeniedError as JevPermissionDeniedError,
)
from llama_jev.core.errors import (
    JevRateLimitError as JevRateLimitError,
)
from llama_jev.core.errors import (
    JevServerError as JevServerError,
)
from llama_jev.core.errors import (
    JevTimeoutError as JevTimeoutError,
)
from llama_jev.core.errors import (
    LocalJudgeTimeoutError as LocalJudgeTimeoutError,
)
from llama_jev.core.errors import (
    MissingRuntimeContextError as MissingRuntimeContextError,
)
from llama_jev.core.errors import (
    PermissionsUnavailableError as PermissionsUnavailableError,
)
from llama_jev.core.errors import (
    QueryTooLargeError as QueryTooLargeError,
)
from llama_jev.core.errors import (
    ResponseWithheldError as ResponseWithheldError,
)
from llama_jev.core.errors import (
    RetrievalInconclusiveError as RetrievalInconclusiveError,
)
from llama_jev.core.errors import (
    RetrievalUnavailableError as RetrievalUnavailableError,
)
from llama_jev.core.errors import (
    UnencodableTextError as UnencodableTextError,
)
from llama_jev.core.errors import (
    UntranslatableFilterError as UntranslatableFilterError,
)
from llama_jev.stores.grants import (
    GrantsError as GrantsError,
)
from llama_jev.stores.grants import (
    RetagIncompleteError as RetagIncompleteError,
)
